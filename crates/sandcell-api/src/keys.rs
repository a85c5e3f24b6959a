//! API keys. A key acts for its owner; an admin key may also manage other owners' keys.

use serde::{Deserialize, Serialize};

use crate::ValidationError;

/// A key name's longest length, in characters.
pub const MAX_KEY_NAME: usize = 100;

/// Checks a key's name (already trimmed): 1 to [`MAX_KEY_NAME`] characters without control
/// characters.
pub fn check_key_name(name: &str) -> Result<(), ValidationError> {
    if name.is_empty() || name.chars().count() > MAX_KEY_NAME || name.chars().any(char::is_control)
    {
        return Err(ValidationError(format!(
            "'name' must be 1 to {MAX_KEY_NAME} characters without control characters"
        )));
    }
    Ok(())
}

/// Checks a key id's shape: 1 to 64 hex digits.
pub fn check_key_id(id: &str) -> Result<(), ValidationError> {
    if id.is_empty() || id.len() > 64 || !id.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(ValidationError(format!("'{id}' is not a key id")));
    }
    Ok(())
}

/// A key to create.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateKey {
    /// A name to recognise it by (1 to 100 characters).
    pub name: String,
    /// Whose resources it acts on (default: the caller's owner; another owner needs an admin key).
    #[serde(default)]
    pub owner: Option<String>,
    /// Whether it may manage other owners' keys (needs an admin key).
    #[serde(default)]
    pub admin: bool,
}

/// A key, without its secret.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct KeyInfo {
    /// Key id (part of the secret's visible prefix).
    pub id: String,
    /// Whose resources it acts on.
    pub owner: String,
    /// Its name.
    pub name: String,
    /// The secret's first characters, to recognise it.
    pub prefix: String,
    /// Whether it may manage other owners' keys.
    pub admin: bool,
    /// When it was created (RFC 3339).
    pub created_at: String,
    /// When it was last used (to the minute).
    pub last_used_at: Option<String>,
    /// When it was revoked.
    pub revoked_at: Option<String>,
}

/// A new key with its secret (shown this once).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NewKey {
    /// The secret: send it as `X-API-Key` or `Authorization: Bearer`.
    pub key: String,
    /// The key's record.
    #[serde(flatten)]
    pub info: KeyInfo,
}

/// Keys.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct KeyList {
    /// Oldest first (in the order they were made).
    pub keys: Vec<KeyInfo>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_names_and_ids_have_shapes() {
        assert!(check_key_name("laptop").is_ok());
        assert!(check_key_name(&"é".repeat(MAX_KEY_NAME)).is_ok());
        for bad in [String::new(), "a\nb".into(), "x".repeat(MAX_KEY_NAME + 1)] {
            assert!(check_key_name(&bad).is_err(), "{bad:?}");
        }
        assert!(check_key_id("0123abcdef").is_ok());
        for bad in [String::new(), "xyz".into(), "a".repeat(65)] {
            assert!(check_key_id(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_new_key_is_flat_on_the_wire() {
        let key = NewKey {
            key: "sc_1_2".into(),
            info: KeyInfo {
                id: "1".into(),
                owner: "alice".into(),
                name: "laptop".into(),
                prefix: "sc_1_".into(),
                admin: false,
                created_at: "1970-01-01T00:00:00.000Z".into(),
                last_used_at: None,
                revoked_at: None,
            },
        };
        let json = serde_json::to_value(&key).unwrap();
        assert_eq!(json["owner"], "alice");
        assert_eq!(serde_json::from_value::<NewKey>(json).unwrap(), key);
    }
}
