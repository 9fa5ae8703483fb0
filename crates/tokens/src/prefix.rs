//! The prefix a request shares with the previous request of its conversation: what a provider
//! reads from its prompt cache. One computation for everything that prices a conversation
//! under prompt caching: the replay's report (every upstream call, from the bodies it saw) and
//! the page's cost without the proxy (each client request, from the proxy's own count).
//!
//! A request is a list of parts, each with an identity and its tokens: what comes before the
//! conversation (the head: model, tools and, on the Responses API, the instructions), then
//! each message or input item. The shared prefix is the longest run of leading parts equal to
//! the previous request's; a different head shares nothing.

/// What comes before a request's conversation, as a prefix part, by its tokens: the tools on
/// chat completions (and Anthropic Messages, counted by chat's rules), everything outside the
/// items on the Responses API (instructions, tools, the schema, the reply priming).
pub fn head_tokens(count: &crate::RequestCount, responses: bool) -> usize {
    if responses {
        count.total - count.per_message.iter().sum::<usize>()
    } else {
        count.tools
    }
}

/// A request's prefix parts by the proxy's own count (what the page prices "without the
/// proxy" with): the head, known by the model and its tokens (the proxy does not hash the
/// tools on the request path), then each message by the low half of its [`crate::stable_hash`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Parts {
    pub ids: Vec<u64>,
    pub tokens: Vec<usize>,
}

impl Parts {
    /// The parts of a request of `model` counted as `count` (`responses`: by the Responses
    /// API's rules, see [`head_tokens`]).
    pub fn of(count: &crate::RequestCount, model: &str, responses: bool) -> Parts {
        let head = head_tokens(count, responses);
        let mut key = Vec::with_capacity(model.len() + 8);
        key.extend_from_slice(model.as_bytes());
        key.extend_from_slice(&(head as u64).to_le_bytes());
        let mut ids = Vec::with_capacity(count.message_hashes.len() + 1);
        ids.push(xxhash_rust::xxh3::xxh3_64(&key));
        ids.extend(count.message_hashes.iter().map(|&h| h as u64));
        let mut tokens = Vec::with_capacity(count.per_message.len() + 1);
        tokens.push(head);
        tokens.extend_from_slice(&count.per_message);
        Parts { ids, tokens }
    }
}

/// The prefix shared with the previous request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SharedPrefix {
    /// Tokens of the shared leading parts.
    pub tokens: usize,
    /// Every part of the previous request leads this one (its conversation was extended, not
    /// rewritten); false for the first request.
    pub extends: bool,
}

/// The prefix `current` (parts with `tokens`, one count per part) shares with `previous`
/// (`None`: no previous request).
pub fn shared_prefix<T: PartialEq>(
    previous: Option<&[T]>,
    current: &[T],
    tokens: &[usize],
) -> SharedPrefix {
    let Some(previous) = previous else {
        return SharedPrefix::default();
    };
    let common = previous
        .iter()
        .zip(current)
        .take_while(|(a, b)| a == b)
        .count();
    SharedPrefix {
        tokens: tokens[..common.min(tokens.len())].iter().sum(),
        extends: common == previous.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shared_prefix_is_the_leading_run_of_equal_parts() {
        let tokens = [10, 5, 7, 3];
        assert_eq!(
            shared_prefix::<u8>(None, &[1, 2, 3, 4], &tokens),
            SharedPrefix::default()
        );
        // Extended: everything the previous request had, plus a part.
        let grown = shared_prefix(Some(&[1, 2, 3][..]), &[1, 2, 3, 4], &tokens);
        assert_eq!(
            grown,
            SharedPrefix {
                tokens: 22,
                extends: true
            }
        );
        // A rewritten third part: the head and the first message are shared.
        let rewritten = shared_prefix(Some(&[1, 2, 9, 4][..]), &[1, 2, 3, 4], &tokens);
        assert_eq!(
            rewritten,
            SharedPrefix {
                tokens: 15,
                extends: false
            }
        );
        // Another head shares nothing.
        let other = shared_prefix(Some(&[0, 2, 3][..]), &[1, 2, 3, 4], &tokens);
        assert_eq!(
            other,
            SharedPrefix {
                tokens: 0,
                extends: false
            }
        );
    }
}
