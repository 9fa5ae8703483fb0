//! Model-name patterns: `*` is any run of characters, `?` any one. Used to route a model to an
//! upstream and to check a proxy key's allowed models.

/// Matches `name` against `pattern`, where `*` is any run of characters and `?` any one.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ni));
            pi += 1;
        } else if let Some((sp, sn)) = star {
            pi = sp + 1;
            ni = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob() {
        assert!(glob_match("gpt-4o*", "gpt-4o"));
        assert!(glob_match("gpt-4o*", "gpt-4o-mini"));
        assert!(!glob_match("gpt-4o*", "gpt-4"));
        assert!(glob_match("claude-*", "claude-3-5-sonnet"));
        assert!(glob_match("*sonnet*", "claude-3-5-sonnet-latest"));
        assert!(glob_match("o?-mini", "o3-mini"));
        assert!(!glob_match("o?-mini", "o3-mini-high"));
        assert!(glob_match("*", ""));
        assert!(!glob_match("", "x"));
    }
}
