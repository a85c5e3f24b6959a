//! Memories: short texts a sandbox (`/v1/sandboxes/{id}/memories`) or its owner
//! (`/v1/memories`) keeps, found again by ranked full-text search. A sandbox made from a
//! snapshot starts with the memories its origin had when the snapshot was taken.
//!
//! The request types carry their rules ([`MemoryText`], [`Category`], [`MemoryQuery`], and
//! [`Tags`] for metadata), so a request that breaks one is refused, naming the field, before
//! any handler runs; the rules themselves are in [`crate::rules`].

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Deref;

use serde::{Deserialize, Serialize};

use crate::rules::{ValidationError, check_category, check_memory_text, check_query};
use crate::values::Tags;

/// The category of a memory added without one.
pub const DEFAULT_CATEGORY: &str = "general";
/// Memories one scope (a sandbox, or an owner's own) may hold.
pub const MAX_MEMORIES: u64 = 10_000;
/// Results of a search that asks for no `limit`.
pub const DEFAULT_SEARCH_LIMIT: u32 = 10;
/// The most results one search returns.
pub const MAX_SEARCH_LIMIT: u32 = 100;
/// Memories in a listing page that asks for no `limit`.
pub const DEFAULT_LIST_LIMIT: u32 = 100;
/// The largest listing page.
pub const MAX_LIST_LIMIT: u32 = 1000;

/// Defines a string newtype checked by `$check` when made and when deserialized.
macro_rules! checked_string {
    ($(#[$doc:meta])* $name:ident, $check:path) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// Checks `value` and keeps it.
            pub fn new(value: impl Into<String>) -> Result<Self, ValidationError> {
                let value = value.into();
                $check(&value)?;
                Ok(Self(value))
            }

            /// The value as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// The value, given back.
            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = ValidationError;
            fn try_from(value: String) -> Result<Self, Self::Error> {
                Self::new(value)
            }
        }

        impl TryFrom<&str> for $name {
            type Error = ValidationError;
            fn try_from(value: &str) -> Result<Self, Self::Error> {
                Self::new(value)
            }
        }

        impl From<$name> for String {
            fn from(value: $name) -> Self {
                value.0
            }
        }

        impl Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

checked_string!(
    /// What a memory remembers: not blank, at most [`crate::rules::MAX_MEMORY_TEXT`] bytes.
    MemoryText,
    check_memory_text
);

checked_string!(
    /// A memory's category: 1 to [`crate::rules::MAX_CATEGORY`] of lowercase letters,
    /// digits, `-`, `_`, `.`.
    Category,
    check_category
);

checked_string!(
    /// What to search memories for: not blank, at most [`crate::rules::MAX_QUERY`] bytes;
    /// its words are looked for (any punctuation or search syntax in it is not syntax).
    MemoryQuery,
    check_query
);

/// `POST /v1/sandboxes/{id}/memories`, `POST /v1/memories`: something to remember.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct AddMemory {
    /// What to remember: not blank, at most 64 KiB, no NUL.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub text: MemoryText,
    /// A category to filter by later (default `general`): lowercase letters, digits, `-`,
    /// `_`, `.`.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, pattern = "^[a-z0-9_.-]{1,64}$"))]
    pub category: Option<Category>,
    /// Metadata (at most 64 entries), kept and shown with it.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = BTreeMap<String, String>))]
    pub metadata: Tags,
}

impl AddMemory {
    /// A memory of `text` in the default category, without metadata.
    pub fn text(text: MemoryText) -> Self {
        Self {
            text,
            category: None,
            metadata: Tags::default(),
        }
    }
}

/// `GET …/memories/search?q=&limit=&category=`: which memories to look for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SearchMemories {
    /// The words to look for; memories matching more of them, and rarer ones, come first.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub query: MemoryQuery,
    /// At most this many results (1 to 100; default 10).
    pub limit: Option<u32>,
    /// Only memories of this category.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, pattern = "^[a-z0-9_.-]{1,64}$"))]
    pub category: Option<Category>,
}

impl SearchMemories {
    /// A search for `query` with the default limit, in every category.
    pub fn new(query: MemoryQuery) -> Self {
        Self {
            query,
            limit: None,
            category: None,
        }
    }
}

/// `GET …/memories?limit=&cursor=&category=`: a page of a scope's memories, newest first.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ListMemories {
    /// At most this many (1 to 1000; default 100).
    pub limit: Option<u32>,
    /// Where to go on: the previous page's `next_cursor`.
    pub cursor: Option<String>,
    /// Only memories of this category.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, pattern = "^[a-z0-9_.-]{1,64}$"))]
    pub category: Option<Category>,
}

/// Whose a memory is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum MemoryScope {
    /// One sandbox's (`sandbox_id` says which); forks of it inherit it.
    Sandbox,
    /// Its owner's, whatever the sandbox.
    Owner,
}

/// A memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Memory {
    /// Its id (`mem-…`).
    pub id: String,
    /// A sandbox's, or its owner's.
    pub scope: MemoryScope,
    /// The sandbox, for a sandbox's memory.
    pub sandbox_id: Option<String>,
    /// What is remembered.
    pub text: String,
    /// Its category.
    pub category: String,
    /// Its metadata.
    pub metadata: BTreeMap<String, String>,
    /// When it was remembered (RFC 3339; a fork's copy keeps its original's time).
    pub created_at: String,
    /// In search results: how well it matched (bm25, higher is better; comparable only
    /// within one search).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
}

/// Memories: a listing page (newest first) or search results (best first).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MemoryList {
    /// The memories.
    pub memories: Vec<Memory>,
    /// A listing's next page: pass it as `cursor` (absent on the last page and in search
    /// results).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_refuse_what_their_rules_refuse_naming_the_field() {
        let ok: AddMemory = serde_json::from_str(
            r#"{"text": "likes tea", "category": "prefs", "metadata": {"k": "v"}}"#,
        )
        .unwrap();
        assert_eq!(
            (ok.text.as_str(), ok.category.as_deref()),
            ("likes tea", Some("prefs"))
        );
        for (body, says) in [
            (r#"{"text": ""}"#.to_string(), "text must not be empty"),
            (
                format!(r#"{{"text": "{}"}}"#, "x".repeat(64 * 1024 + 1)),
                "over the 64 KiB limit",
            ),
            (
                r#"{"text": "a", "category": "Bad Category"}"#.to_string(),
                "category \"Bad Category\" must be",
            ),
            (r#"{"text": "a", "extra": 1}"#.to_string(), "extra"),
            (r#"{"category": "a"}"#.to_string(), "text"),
        ] {
            let err = serde_json::from_str::<AddMemory>(&body).unwrap_err();
            assert!(err.to_string().contains(says), "{err}");
        }
        let many: BTreeMap<String, String> =
            (0..=64).map(|i| (i.to_string(), String::new())).collect();
        let body = serde_json::json!({"text": "a", "metadata": many});
        assert!(serde_json::from_value::<AddMemory>(body).is_err());
        assert!(serde_json::from_str::<SearchMemories>(r#"{"query": " "}"#).is_err());
        assert!(MemoryQuery::new("\"NEAR( OR").is_ok());
    }

    #[test]
    fn a_memory_shows_its_score_only_in_search_results() {
        let m = Memory {
            id: "mem-0123456789abcdef".into(),
            scope: MemoryScope::Owner,
            sandbox_id: None,
            text: "t".into(),
            category: DEFAULT_CATEGORY.into(),
            metadata: BTreeMap::new(),
            created_at: "2026-01-01T00:00:00.000Z".into(),
            score: None,
        };
        let v = serde_json::to_value(&m).unwrap();
        assert_eq!(v["scope"], "owner");
        assert!(v.get("score").is_none());
        let back: Memory = serde_json::from_value(v).unwrap();
        assert_eq!(back, m);
    }
}
