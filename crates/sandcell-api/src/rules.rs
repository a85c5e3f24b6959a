//! The rules on values the API takes, each in one place: the types of [`crate::values`]
//! apply them when a request is read (or a client builds one), the service checks the rest
//! (record ids, owners) with them, and the engine checks its own inputs with the same
//! functions.

use std::collections::BTreeMap;

/// A value broke a rule; the message names the field and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ValidationError(pub String);

fn invalid<T>(message: String) -> Result<T, ValidationError> {
    Err(ValidationError(message))
}

/// The largest code of one run, in bytes. It travels to the guest in one frame (16 MiB at
/// most) as a JSON string, whose escaping can double it.
pub const MAX_CODE_BYTES: usize = 8 * 1024 * 1024;

/// At most this many tags (labels, metadata, snapshot tags) on one thing.
pub const MAX_TAGS: usize = 64;
/// A tag key's longest length, in bytes.
pub const MAX_TAG_KEY: usize = 128;
/// A tag value's longest length, in bytes.
pub const MAX_TAG_VALUE: usize = 1024;

/// The longest timeout the API takes (7 days), in seconds.
pub const MAX_TIMEOUT_SECS: f64 = 7.0 * 86_400.0;

/// Checks code's size.
pub fn check_code(code: &str) -> Result<(), ValidationError> {
    if code.len() > MAX_CODE_BYTES {
        return invalid(format!(
            "code of {} bytes is over the {} MiB limit",
            code.len(),
            MAX_CODE_BYTES >> 20
        ));
    }
    Ok(())
}

/// Checks a set of tags (`what`: `labels`, `metadata`, `tags`): at most [`MAX_TAGS`] keys of 1
/// to [`MAX_TAG_KEY`] bytes, values of at most [`MAX_TAG_VALUE`] bytes, neither with control
/// characters.
pub fn check_tags(what: &str, tags: &BTreeMap<String, String>) -> Result<(), ValidationError> {
    if tags.len() > MAX_TAGS {
        return invalid(format!(
            "at most {MAX_TAGS} {what} entries, got {}",
            tags.len()
        ));
    }
    for (k, v) in tags {
        if k.is_empty() || k.len() > MAX_TAG_KEY || k.chars().any(char::is_control) {
            return invalid(format!(
                "{what} key {k:?} must be 1 to {MAX_TAG_KEY} bytes without control characters"
            ));
        }
        if v.len() > MAX_TAG_VALUE || v.chars().any(char::is_control) {
            return invalid(format!(
                "{what} value of {k:?} must be at most {MAX_TAG_VALUE} bytes without control characters"
            ));
        }
    }
    Ok(())
}

/// Checks a sandbox id's shape (`sb-` and 1 to 64 of lowercase letters, digits, `-`), so junk
/// is an invalid argument before any lookup.
pub fn check_sandbox_id(id: &str) -> Result<(), ValidationError> {
    let rest = id.strip_prefix("sb-").unwrap_or("");
    let ok = (1..=64).contains(&rest.len())
        && rest
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok {
        Ok(())
    } else {
        invalid(format!(
            "'{id}' is not a sandbox id (they look like sb-1a2b3c4d5e6f)"
        ))
    }
}

/// Checks the shape of a service-made record id: `prefix`, `-` and 16 hex digits
/// (`ex-…`, `sn-…`); `what` names it in the error ("an export").
pub fn check_record_id(id: &str, prefix: &str, what: &str) -> Result<(), ValidationError> {
    let ok = id
        .strip_prefix(prefix)
        .and_then(|r| r.strip_prefix('-'))
        .is_some_and(|r| r.len() == 16 && r.chars().all(|c| c.is_ascii_hexdigit()));
    if ok {
        Ok(())
    } else {
        invalid(format!(
            "'{id}' is not {what} id (they look like {prefix}-0123456789abcdef)"
        ))
    }
}

/// Checks an owner name: 1 to 64 of letters, digits, `-`, `_`, `.`, `@`.
pub fn check_owner(owner: &str) -> Result<(), ValidationError> {
    let ok = (1..=64).contains(&owner.len())
        && owner
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c));
    if ok {
        Ok(())
    } else {
        invalid(format!(
            "owner '{owner}' must be 1 to 64 letters, digits, '-', '_', '.' or '@'"
        ))
    }
}

/// A memory's longest text, in bytes.
pub const MAX_MEMORY_TEXT: usize = 64 * 1024;
/// A memory category's longest length, in bytes.
pub const MAX_CATEGORY: usize = 64;
/// A memory search's longest query, in bytes.
pub const MAX_QUERY: usize = 4096;

/// Checks a memory's text: not blank, at most [`MAX_MEMORY_TEXT`] bytes, no NUL (it is
/// stored and searched as text).
pub fn check_memory_text(text: &str) -> Result<(), ValidationError> {
    if text.trim().is_empty() {
        return invalid("text must not be empty".to_string());
    }
    if text.len() > MAX_MEMORY_TEXT {
        return invalid(format!(
            "text of {} bytes is over the {} KiB limit",
            text.len(),
            MAX_MEMORY_TEXT >> 10
        ));
    }
    if text.contains('\0') {
        return invalid("text must not contain NUL characters".to_string());
    }
    Ok(())
}

/// Checks a memory category: 1 to [`MAX_CATEGORY`] of lowercase ASCII letters, digits, `-`,
/// `_`, `.` (one spelling per category, so a filter finds them all).
pub fn check_category(category: &str) -> Result<(), ValidationError> {
    let ok = (1..=MAX_CATEGORY).contains(&category.len())
        && category
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-_.".contains(c));
    if ok {
        Ok(())
    } else {
        invalid(format!(
            "category {category:?} must be 1 to {MAX_CATEGORY} of lowercase letters, digits, '-', '_' or '.'"
        ))
    }
}

/// Checks a memory search's query: not blank, at most [`MAX_QUERY`] bytes. (Any text is
/// safe to search for: its words are looked for, never read as search syntax.)
pub fn check_query(query: &str) -> Result<(), ValidationError> {
    if query.trim().is_empty() {
        return invalid("query must not be empty".to_string());
    }
    if query.len() > MAX_QUERY {
        return invalid(format!(
            "query of {} bytes is over the {MAX_QUERY}-byte limit",
            query.len()
        ));
    }
    Ok(())
}

/// `path` made absolute against the folder `cwd` (itself absolute), with `.`, `..` and empty
/// segments resolved (`..` stops at the root): how paths inside a sandbox or an image are
/// compared and joined.
pub fn absolute_path(cwd: &str, path: &str) -> String {
    let joined = if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{cwd}/{path}")
    };
    let mut parts: Vec<&str> = Vec::new();
    for part in joined.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    format!("/{}", parts.join("/"))
}

/// Whole seconds to milliseconds, refusing what would overflow.
pub fn secs_to_ms(field: &str, secs: u64) -> Result<u64, ValidationError> {
    secs.checked_mul(1000)
        .ok_or_else(|| ValidationError(format!("{field} {secs} is too large")))
}

/// Fractional seconds (a timeout) to whole milliseconds, rounded up: positive, finite and at
/// most [`MAX_TIMEOUT_SECS`].
pub fn timeout_secs_to_ms(field: &str, secs: f64) -> Result<u64, ValidationError> {
    if secs.is_finite() && secs > 0.0 && secs <= MAX_TIMEOUT_SECS {
        // In range by the check above: at most 6.048e8 ms.
        Ok((secs * 1000.0).ceil() as u64)
    } else {
        invalid(format!(
            "{field} {secs} must be positive and at most 7 days"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_refuse_control_characters_in_keys_and_values() {
        let ok: BTreeMap<_, _> = [("team".to_string(), "ml".to_string())].into();
        assert!(check_tags("labels", &ok).is_ok());
        for (k, v) in [("", "x"), ("a\nb", "x"), ("k", "a\u{7}b"), ("k", "line\n")] {
            let tags: BTreeMap<_, _> = [(k.to_string(), v.to_string())].into();
            assert!(check_tags("tags", &tags).is_err(), "{k:?}={v:?}");
        }
        let long: BTreeMap<_, _> = [("k".to_string(), "v".repeat(MAX_TAG_VALUE + 1))].into();
        assert!(check_tags("tags", &long).is_err());
        let many: BTreeMap<_, _> = (0..=MAX_TAGS)
            .map(|i| (i.to_string(), String::new()))
            .collect();
        assert!(check_tags("tags", &many).is_err());
    }

    #[test]
    fn ids_and_owners_have_shapes() {
        assert!(check_sandbox_id("sb-1a2b3c").is_ok());
        for bad in [
            "",
            "sb-",
            "sb-ABC",
            "x-1",
            "sb-a/b",
            &format!("sb-{}", "a".repeat(65)),
        ] {
            assert!(check_sandbox_id(bad).is_err(), "{bad}");
        }
        assert!(check_record_id("sn-0123456789abcdef", "sn", "a snapshot").is_ok());
        assert!(check_record_id("sn-0123", "sn", "a snapshot").is_err());
        assert!(check_owner("alice@example.com").is_ok());
        for bad in ["", "a b", "a/b", &"x".repeat(65)] {
            assert!(check_owner(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn memory_texts_categories_and_queries_have_rules() {
        assert!(check_memory_text("the user likes tea").is_ok());
        assert!(check_memory_text(&"x".repeat(MAX_MEMORY_TEXT)).is_ok());
        for (bad, says) in [
            ("", "empty"),
            (" \n\t", "empty"),
            ("a\0b", "NUL"),
            (&"x".repeat(MAX_MEMORY_TEXT + 1), "over the 64 KiB limit"),
        ] {
            let err = check_memory_text(bad).unwrap_err();
            assert!(err.0.starts_with("text") && err.0.contains(says), "{err}");
        }
        for good in [
            "general",
            "user_prefs",
            "a",
            "v1.2-beta",
            &"c".repeat(MAX_CATEGORY),
        ] {
            assert!(check_category(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "Prefs",
            "a b",
            "a/b",
            "é",
            &"c".repeat(MAX_CATEGORY + 1),
        ] {
            let err = check_category(bad).unwrap_err();
            assert!(err.0.starts_with("category"), "{err}");
        }
        assert!(check_query("\"NEAR( OR").is_ok());
        assert!(check_query("  ").is_err());
        assert!(check_query(&"q".repeat(MAX_QUERY + 1)).is_err());
    }

    #[test]
    fn code_and_timeouts_have_limits() {
        assert!(check_code("print(1)").is_ok());
        assert!(check_code(&"x".repeat(MAX_CODE_BYTES + 1)).is_err());
        assert_eq!(timeout_secs_to_ms("t", 1.5), Ok(1500));
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, MAX_TIMEOUT_SECS + 1.0] {
            assert!(timeout_secs_to_ms("t", bad).is_err(), "{bad}");
        }
        assert!(secs_to_ms("t", u64::MAX).is_err());
    }
}
