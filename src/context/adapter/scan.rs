//! Finding values in JSON bytes without building them: enough to locate a top-level member
//! and the elements of an array, for every adapter's `spans`. Anything that is not well-formed
//! JSON gives `None`.

use std::ops::Range;

fn ws(raw: &[u8], mut i: usize) -> usize {
    while i < raw.len() && matches!(raw[i], b' ' | b'\t' | b'\n' | b'\r') {
        i += 1;
    }
    i
}

/// The end of the string starting at `i` (its opening quote), after its closing quote.
fn string_end(raw: &[u8], i: usize) -> Option<usize> {
    let mut j = i + 1;
    while j < raw.len() {
        match raw[j] {
            b'\\' => j += 2,
            b'"' => return Some(j + 1),
            _ => j += 1,
        }
    }
    None
}

/// The end of the value starting at `i` (after any whitespace).
fn value_end(raw: &[u8], i: usize) -> Option<usize> {
    let i = ws(raw, i);
    match *raw.get(i)? {
        b'"' => string_end(raw, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            while j < raw.len() {
                match raw[j] {
                    b'"' => {
                        j = string_end(raw, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            None
        }
        _ => {
            let mut j = i;
            while j < raw.len()
                && !matches!(raw[j], b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
            {
                j += 1;
            }
            (j > i).then_some(j)
        }
    }
}

/// The span of the value of the top-level member `name` (the last one when repeated, as
/// the parser keeps it).
pub fn member(raw: &[u8], name: &[u8]) -> Option<Range<usize>> {
    let mut i = ws(raw, 0);
    if raw.get(i) != Some(&b'{') {
        return None;
    }
    i = ws(raw, i + 1);
    let mut found = None;
    if raw.get(i) == Some(&b'}') {
        return None;
    }
    loop {
        if raw.get(i) != Some(&b'"') {
            return None;
        }
        let key_end = string_end(raw, i)?;
        let key = &raw[i..key_end];
        let matches = if key.contains(&b'\\') {
            serde_json::from_slice::<String>(key).ok()?.as_bytes() == name
        } else {
            &key[1..key.len() - 1] == name
        };
        i = ws(raw, key_end);
        if raw.get(i) != Some(&b':') {
            return None;
        }
        let start = ws(raw, i + 1);
        let end = value_end(raw, start)?;
        if matches {
            found = Some(start..end);
        }
        i = ws(raw, end);
        match raw.get(i)? {
            b',' => i = ws(raw, i + 1),
            b'}' => return found,
            _ => return None,
        }
    }
}

/// The spans of the elements of the array at `list`.
pub fn elements(raw: &[u8], list: Range<usize>) -> Option<Vec<Range<usize>>> {
    if raw.get(list.start) != Some(&b'[') {
        return None;
    }
    let mut out = Vec::new();
    let mut i = ws(raw, list.start + 1);
    if raw.get(i) == Some(&b']') {
        return Some(out);
    }
    loop {
        let start = ws(raw, i);
        let end = value_end(raw, start)?;
        out.push(start..end);
        i = ws(raw, end);
        match raw.get(i)? {
            b',' => i += 1,
            b']' if i + 1 == list.end => return Some(out),
            _ => return None,
        }
    }
}
