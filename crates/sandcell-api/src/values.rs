//! Values that carry their rule: each is checked once, when it is made (parsed from a string,
//! converted from a plain value or deserialized from a request), so code that holds one never
//! checks it again. The rules themselves are the functions in [`crate::rules`]; the engine,
//! which takes plain values from embedded callers, applies the same functions.
//!
//! Requests use these types; responses keep plain types, so a client never refuses an answer.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Deref;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::rules::{
    ValidationError, check_code, check_sandbox_id, check_tags, secs_to_ms, timeout_secs_to_ms,
};

/// The regular expression a sandbox id matches (the OpenAPI document's pattern).
pub const SANDBOX_ID_PATTERN: &str = "^sb-[a-z0-9-]{1,64}$";

/// A sandbox id of the right shape (`sb-` and 1 to 64 of lowercase letters, digits, `-`).
/// Whether such a sandbox exists, and is the caller's, is the service's question.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SandboxId(String);

impl SandboxId {
    /// Checks `id` and keeps it.
    pub fn parse(id: impl Into<String>) -> Result<Self, ValidationError> {
        let id = id.into();
        check_sandbox_id(&id)?;
        Ok(Self(id))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for SandboxId {
    type Error = ValidationError;
    fn try_from(id: String) -> Result<Self, Self::Error> {
        Self::parse(id)
    }
}

impl TryFrom<&str> for SandboxId {
    type Error = ValidationError;
    fn try_from(id: &str) -> Result<Self, Self::Error> {
        Self::parse(id)
    }
}

impl FromStr for SandboxId {
    type Err = ValidationError;
    fn from_str(id: &str) -> Result<Self, Self::Err> {
        Self::parse(id)
    }
}

impl From<SandboxId> for String {
    fn from(id: SandboxId) -> Self {
        id.0
    }
}

impl Deref for SandboxId {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for SandboxId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SandboxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl PartialEq<str> for SandboxId {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for SandboxId {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

/// Code for a kernel, at most [`crate::rules::MAX_CODE_BYTES`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Code(String);

impl Code {
    /// Checks `code`'s size and keeps it.
    pub fn new(code: impl Into<String>) -> Result<Self, ValidationError> {
        let code = code.into();
        check_code(&code)?;
        Ok(Self(code))
    }

    /// The code as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The code, given back.
    pub fn into_string(self) -> String {
        self.0
    }
}

impl TryFrom<String> for Code {
    type Error = ValidationError;
    fn try_from(code: String) -> Result<Self, Self::Error> {
        Self::new(code)
    }
}

impl TryFrom<&str> for Code {
    type Error = ValidationError;
    fn try_from(code: &str) -> Result<Self, Self::Error> {
        Self::new(code)
    }
}

impl From<Code> for String {
    fn from(code: Code) -> Self {
        code.0
    }
}

impl Deref for Code {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

/// Tags on one thing (a sandbox's labels or metadata, a snapshot's tags): at most
/// [`crate::rules::MAX_TAGS`] of them, keys and values of bounded length without control
/// characters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    try_from = "BTreeMap<String, String>",
    into = "BTreeMap<String, String>"
)]
pub struct Tags(BTreeMap<String, String>);

impl Tags {
    /// Checks `tags` and keeps them.
    pub fn new(tags: BTreeMap<String, String>) -> Result<Self, ValidationError> {
        check_tags("tag", &tags)?;
        Ok(Self(tags))
    }

    /// The tags, given back.
    pub fn into_inner(self) -> BTreeMap<String, String> {
        self.0
    }
}

impl TryFrom<BTreeMap<String, String>> for Tags {
    type Error = ValidationError;
    fn try_from(tags: BTreeMap<String, String>) -> Result<Self, Self::Error> {
        Self::new(tags)
    }
}

impl<const N: usize> TryFrom<[(&str, &str); N]> for Tags {
    type Error = ValidationError;
    fn try_from(pairs: [(&str, &str); N]) -> Result<Self, Self::Error> {
        Self::new(
            pairs
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }
}

impl From<Tags> for BTreeMap<String, String> {
    fn from(tags: Tags) -> Self {
        tags.0
    }
}

impl Deref for Tags {
    type Target = BTreeMap<String, String>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

/// How long a run may take (an exec, code, a background process): positive, finite and at
/// most [`crate::rules::MAX_TIMEOUT_SECS`] seconds; fractions allowed.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Serialize, Deserialize)]
#[serde(try_from = "f64", into = "f64")]
pub struct Timeout(f64);

impl Timeout {
    /// Checks `secs` and keeps it.
    pub fn from_secs(secs: f64) -> Result<Self, ValidationError> {
        timeout_secs_to_ms("timeout_secs", secs)?;
        Ok(Self(secs))
    }

    /// The timeout in seconds.
    pub fn secs(self) -> f64 {
        self.0
    }

    /// The timeout in whole milliseconds, rounded up.
    pub fn as_ms(self) -> u64 {
        // In range by construction: at most 6.048e8 ms.
        (self.0 * 1000.0).ceil() as u64
    }
}

impl TryFrom<f64> for Timeout {
    type Error = ValidationError;
    fn try_from(secs: f64) -> Result<Self, Self::Error> {
        Self::from_secs(secs)
    }
}

impl From<Timeout> for f64 {
    fn from(t: Timeout) -> Self {
        t.0
    }
}

/// Whole seconds of a lifetime or an interval, small enough that their milliseconds fit in
/// a `u64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "u64", into = "u64")]
pub struct Seconds(u64);

impl Seconds {
    /// Checks `secs` and keeps it.
    pub fn new(secs: u64) -> Result<Self, ValidationError> {
        secs_to_ms("seconds", secs)?;
        Ok(Self(secs))
    }

    /// The seconds.
    pub fn get(self) -> u64 {
        self.0
    }

    /// Whole seconds of `ms` milliseconds (rounded down; always in range).
    pub fn from_ms(ms: u64) -> Self {
        Self(ms / 1000)
    }

    /// In milliseconds (cannot overflow, by construction).
    pub fn as_ms(self) -> u64 {
        self.0 * 1000
    }
}

impl TryFrom<u64> for Seconds {
    type Error = ValidationError;
    fn try_from(secs: u64) -> Result<Self, Self::Error> {
        Self::new(secs)
    }
}

impl From<Seconds> for u64 {
    fn from(s: Seconds) -> Self {
        s.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::{MAX_CODE_BYTES, MAX_TAGS, MAX_TIMEOUT_SECS};

    #[test]
    fn a_sandbox_id_is_checked_when_made_and_when_deserialized() {
        let id = SandboxId::parse("sb-1a2b").unwrap();
        assert_eq!(&*id, "sb-1a2b");
        assert_eq!(serde_json::to_string(&id).unwrap(), "\"sb-1a2b\"");
        assert!("sb-ABC".parse::<SandboxId>().is_err());
        let err = serde_json::from_str::<SandboxId>("\"../etc\"").unwrap_err();
        assert!(err.to_string().contains("is not a sandbox id"), "{err}");
        assert_eq!(
            serde_json::from_str::<SandboxId>("\"sb-x\"").unwrap(),
            "sb-x"
        );
    }

    #[test]
    fn code_tags_and_durations_refuse_what_their_rule_refuses() {
        let big = serde_json::to_string(&"x".repeat(MAX_CODE_BYTES + 1)).unwrap();
        let err = serde_json::from_str::<Code>(&big).unwrap_err();
        assert!(err.to_string().contains("over the 8 MiB limit"), "{err}");

        let err = serde_json::from_str::<Tags>(r#"{"k":"a\nb"}"#).unwrap_err();
        assert!(err.to_string().contains("control characters"), "{err}");
        let many: BTreeMap<_, _> = (0..=MAX_TAGS)
            .map(|i| (i.to_string(), String::new()))
            .collect();
        assert!(Tags::new(many).is_err());
        assert_eq!(Tags::try_from([("team", "ml")]).unwrap()["team"], "ml");

        assert_eq!(
            serde_json::from_str::<Timeout>("1.5").unwrap().as_ms(),
            1500
        );
        for bad in ["0", "-1", &(MAX_TIMEOUT_SECS + 1.0).to_string()] {
            assert!(serde_json::from_str::<Timeout>(bad).is_err(), "{bad}");
        }
        assert_eq!(Seconds::new(60).unwrap().as_ms(), 60_000);
        assert!(serde_json::from_str::<Seconds>(&u64::MAX.to_string()).is_err());
    }
}
