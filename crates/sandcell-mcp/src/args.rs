//! Argument shapes the tools take beside their own, as other agent setups already send them:
//! `dependencies` as a map of package name to version, file entries with `source` and
//! `destination`. Each shape parses into the one form the tools act on; an entry that fits
//! none is an error saying which shapes there are and what is wrong with this one, and the
//! JSON schema the tools advertise lists every shape (`anyOf`).

use std::collections::BTreeMap;
use std::fmt;

use schemars::JsonSchema;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One package a session needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dependency {
    /// Its install name.
    pub name: String,
    /// The version it must have (`None`: any).
    pub version: Option<String>,
}

/// `create_session`'s `dependencies`: a list of names, or a map of name to version.
#[derive(Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(untagged)]
pub enum Dependencies {
    /// Package names (`["pandas", "scikit-learn"]`): any installed version will do.
    Names(Vec<String>),
    /// Package name -> version (`{"pandas": "2.2.3", "matplotlib": ""}`): `""` (or `"*"`) for
    /// any version, else exactly this one (`"2.2.3"` or `"==2.2.3"`), as the runtime reports it.
    Versions(BTreeMap<String, String>),
}

impl<'de> Deserialize<'de> for Dependencies {
    // By hand rather than `untagged`: a wrong shape then says what the two right ones are.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Either;
        impl<'de> Visitor<'de> for Either {
            type Value = Dependencies;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a list of package names, or a map of package name to version (\"\" for any)",
                )
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut names = Vec::new();
                while let Some(name) = seq.next_element::<String>()? {
                    names.push(name);
                }
                Ok(Dependencies::Names(names))
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut versions = BTreeMap::new();
                while let Some((name, version)) = map.next_entry::<String, String>()? {
                    versions.insert(name, version);
                }
                Ok(Dependencies::Versions(versions))
            }
        }
        d.deserialize_any(Either)
    }
}

impl Dependencies {
    /// The packages, names and versions checked: the message of an `invalid_argument` when
    /// one is not a package name or not an exact version.
    pub fn resolve(self) -> Result<Vec<Dependency>, String> {
        let pairs: Vec<(String, String)> = match self {
            Dependencies::Names(names) => names.into_iter().map(|n| (n, String::new())).collect(),
            Dependencies::Versions(map) => map.into_iter().collect(),
        };
        pairs
            .into_iter()
            .map(|(name, version)| {
                if !valid_package_name(&name) {
                    return Err(format!("{name:?} is not a package name"));
                }
                let version = exact_version(&name, &version)?;
                Ok(Dependency { name, version })
            })
            .collect()
    }
}

/// The version `wanted` asks for: `None` for any, else the exact version.
fn exact_version(name: &str, wanted: &str) -> Result<Option<String>, String> {
    let v = wanted.trim();
    if v.is_empty() || v == "*" {
        return Ok(None);
    }
    let v = v.strip_prefix("==").unwrap_or(v).trim();
    // Nothing can be installed in a sandbox, so only the installed version is compared: a
    // range would need a resolver for each runtime's rules, and an exact pin says it all.
    if v.starts_with(['<', '>', '~', '^', '!', '=']) || v.contains([',', ' ', '|']) {
        return Err(format!(
            "{name}: {wanted:?} is a range; give an exact version (\"2.2.3\") or \"\" for any (sandboxes cannot install packages, so the installed version is what is checked)"
        ));
    }
    let ok = !v.is_empty()
        && v.len() <= 64
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '+' | '!'));
    if !ok {
        return Err(format!("{name}: {wanted:?} is not a version"));
    }
    Ok(Some(v.to_string()))
}

/// A package name as package managers write them: letters, digits, `-`, `_`, `.`, `@`, `/`
/// (scoped npm packages), nothing a shell or a language would interpret.
pub fn valid_package_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 214
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@' | '/'))
}

/// What is wrong with the installed packages, one entry per package (empty: all is well):
/// `name` when it is missing, `name==wanted (installed: version)` when its version differs.
/// `listing` has one `name<TAB>version` line per package (version empty when missing, `?`
/// when installed with no version to tell); a package with no line counts as missing.
pub fn unmet(deps: &[Dependency], listing: &str) -> Vec<String> {
    let installed: BTreeMap<&str, &str> = listing
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .map(|(n, v)| (n.trim(), v.trim()))
        .collect();
    deps.iter()
        .filter_map(|d| match (installed.get(d.name.as_str()), &d.version) {
            (None | Some(&""), _) => Some(d.name.clone()),
            (Some(have), Some(want)) if have != want => {
                Some(format!("{}=={want} (installed: {have})", d.name))
            }
            _ => None,
        })
        .collect()
}

/// One `import_files` entry, in whichever of its shapes it came.
#[derive(Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(untagged)]
pub enum ImportFile {
    /// `path` plus exactly one source: `text`, `base64`, `host_path` or `export_id`.
    Put(PutFile),
    /// `source`, a file or folder on the server's host (inside its import allow-list), copied
    /// to `destination`.
    Copy(CopyFile),
    /// `path` in another session (`session_id`) copied to `destination`.
    FromSession(SessionFile),
}

/// A file given by its contents or by where to take it from.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PutFile {
    /// Where it goes (absolute under /workspace, /tmp or /home/sandbox, or relative to /workspace).
    pub path: String,
    /// Its contents as text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Its contents as base64.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base64: Option<String>,
    /// A file or folder on the server's host, inside its import allow-list.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    /// An export made by `export_files` from another session.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub export_id: Option<String>,
}

/// A host file or folder copied in.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CopyFile {
    /// A file or folder on the server's host, inside its import allow-list.
    pub source: String,
    /// Where it goes in the session (absolute, or relative to /workspace).
    pub destination: String,
}

/// A file or folder of another session copied in.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionFile {
    /// The session it comes from (it may have ended if it exported the path).
    pub session_id: String,
    /// Its path there: the copy that session's `export_files` kept, else the file as it is now.
    pub path: String,
    /// Where it goes in this session (absolute, or relative to /workspace).
    pub destination: String,
}

const IMPORT_SHAPES: &str = "{path, text|base64|host_path|export_id}, {source, destination} (a host path) or {session_id, path, destination} (a file of another session)";

impl ImportFile {
    /// Reads one entry: its keys say which shape it claims, and that shape's errors are the
    /// ones reported (not "matched no variant").
    pub fn from_value(value: Value) -> Result<Self, String> {
        let Value::Object(fields) = value else {
            return Err(format!("each file is an object: {IMPORT_SHAPES}"));
        };
        let has = |k: &str| fields.contains_key(k);
        let (shape, parsed) = if has("session_id") {
            let p = serde_json::from_value(Value::Object(fields)).map(ImportFile::FromSession);
            ("{session_id, path, destination}", p)
        } else if has("source") {
            let p = serde_json::from_value(Value::Object(fields)).map(ImportFile::Copy);
            ("{source, destination}", p)
        } else if has("destination") {
            return Err(
                "destination goes with source (a host path) or session_id (a file of another session); with text, base64, host_path or export_id the file goes to path".into(),
            );
        } else if fields.is_empty() {
            return Err(format!("an empty file entry: give {IMPORT_SHAPES}"));
        } else {
            let p = serde_json::from_value(Value::Object(fields)).map(ImportFile::Put);
            ("{path, text|base64|host_path|export_id}", p)
        };
        let parsed = parsed.map_err(|e| format!("a file given as {shape}: {e}"))?;
        if let ImportFile::Put(p) = &parsed {
            let given: Vec<&str> = [
                ("text", p.text.is_some()),
                ("base64", p.base64.is_some()),
                ("host_path", p.host_path.is_some()),
                ("export_id", p.export_id.is_some()),
            ]
            .into_iter()
            .filter_map(|(k, set)| set.then_some(k))
            .collect();
            if given.len() != 1 {
                let got = if given.is_empty() {
                    "none".to_string()
                } else {
                    given.join(" and ")
                };
                return Err(format!(
                    "file {:?}: give exactly one of text, base64, host_path, export_id (got {got})",
                    p.path
                ));
            }
        }
        Ok(parsed)
    }
}

impl<'de> Deserialize<'de> for ImportFile {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        ImportFile::from_value(Value::deserialize(d)?).map_err(de::Error::custom)
    }
}

/// `import_files`' `files`, each error naming the entry it is about.
pub fn import_files<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<ImportFile>, D::Error> {
    Vec::<Value>::deserialize(d)?
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            ImportFile::from_value(v).map_err(|e| de::Error::custom(format!("files[{i}]: {e}")))
        })
        .collect()
}

/// One `export_files` entry in the `files` shape.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExportFile {
    /// A file or folder in the session (a folder comes as a tar archive).
    pub source: String,
}

/// `path` as the API names it: absolute (relative ones are under /workspace), with no `.`,
/// `..` or empty segments; to match a path given to an export.
pub fn absolute(path: &str) -> String {
    sandcell_api::rules::absolute_path("/workspace", path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deps(v: Value) -> Result<Vec<Dependency>, String> {
        serde_json::from_value::<Dependencies>(v)
            .map_err(|e| e.to_string())?
            .resolve()
    }

    fn dep(name: &str, version: Option<&str>) -> Dependency {
        Dependency {
            name: name.into(),
            version: version.map(str::to_string),
        }
    }

    #[test]
    fn dependencies_as_a_list_or_a_map() {
        assert_eq!(
            deps(json!(["pandas", "matplotlib"])).unwrap(),
            vec![dep("pandas", None), dep("matplotlib", None)]
        );
        assert_eq!(
            deps(json!({"pandas": "2.2.3", "matplotlib": "", "numpy": "*", "scipy": "==1.13.0"}))
                .unwrap(),
            vec![
                dep("matplotlib", None),
                dep("numpy", None),
                dep("pandas", Some("2.2.3")),
                dep("scipy", Some("1.13.0")),
            ]
        );
        assert_eq!(deps(json!({})).unwrap(), vec![]);
    }

    #[test]
    fn dependencies_refuse_other_shapes_ranges_and_bad_names() {
        let e = deps(json!("pandas")).unwrap_err();
        assert!(
            e.contains("a list of package names, or a map of package name to version"),
            "{e}"
        );
        let e = deps(json!({"pandas": 2})).unwrap_err();
        assert!(
            e.contains("invalid type: integer `2`, expected a string"),
            "{e}"
        );
        let e = deps(json!({"pandas": ">=2.0"})).unwrap_err();
        assert!(
            e.contains("pandas: \">=2.0\" is a range; give an exact version"),
            "{e}"
        );
        let e = deps(json!({"pandas": "2.0; rm -rf /"})).unwrap_err();
        assert!(
            e.contains("is a range") || e.contains("not a version"),
            "{e}"
        );
        let e = deps(json!({"pandas": "2.0$(x)"})).unwrap_err();
        assert!(e.contains("\"2.0$(x)\" is not a version"), "{e}");
        let e = deps(json!({"pan das": ""})).unwrap_err();
        assert!(e.contains("\"pan das\" is not a package name"), "{e}");
        let e = deps(json!(["ok", "x;y"])).unwrap_err();
        assert!(e.contains("\"x;y\" is not a package name"), "{e}");
    }

    #[test]
    fn unmet_names_missing_packages_and_other_versions() {
        let wanted = [
            dep("pandas", Some("2.2.3")),
            dep("numpy", None),
            dep("gone", None),
            dep("scipy", Some("1.0")),
            dep("unlisted", None),
        ];
        let listing = "pandas\t2.2.3\nnumpy\t1.26.4\ngone\t\nscipy\t1.13.0\n";
        assert_eq!(
            unmet(&wanted, listing),
            vec![
                "gone".to_string(),
                "scipy==1.0 (installed: 1.13.0)".into(),
                "unlisted".into()
            ]
        );
        assert!(unmet(&wanted[..2], listing).is_empty());
        // Installed without a version to tell: fine unpinned, a mismatch when pinned.
        assert!(unmet(&[dep("tool", None)], "tool\t?\n").is_empty());
        assert_eq!(
            unmet(&[dep("tool", Some("1"))], "tool\t?\n"),
            vec!["tool==1 (installed: ?)".to_string()]
        );
    }

    fn import(v: Value) -> Result<ImportFile, String> {
        serde_json::from_value::<ImportFile>(v).map_err(|e| e.to_string())
    }

    #[test]
    fn import_entries_in_each_shape() {
        assert_eq!(
            import(json!({"path": "a.txt", "text": "hi"})).unwrap(),
            ImportFile::Put(PutFile {
                path: "a.txt".into(),
                text: Some("hi".into()),
                base64: None,
                host_path: None,
                export_id: None,
            })
        );
        assert_eq!(
            import(json!({"source": "/srv/data.csv", "destination": "in/data.csv"})).unwrap(),
            ImportFile::Copy(CopyFile {
                source: "/srv/data.csv".into(),
                destination: "in/data.csv".into(),
            })
        );
        assert_eq!(
            import(json!({"session_id": "sb-1", "path": "out.csv", "destination": "in.csv"}))
                .unwrap(),
            ImportFile::FromSession(SessionFile {
                session_id: "sb-1".into(),
                path: "out.csv".into(),
                destination: "in.csv".into(),
            })
        );
    }

    #[test]
    fn import_entries_that_fit_no_shape_say_why() {
        let cases = [
            (
                json!({}),
                "an empty file entry: give {path, text|base64|host_path|export_id}",
            ),
            (json!("a.txt"), "each file is an object"),
            (
                json!({"path": "a.txt"}),
                "file \"a.txt\": give exactly one of text, base64, host_path, export_id (got none)",
            ),
            (
                json!({"path": "a", "text": "x", "base64": "eA=="}),
                "(got text and base64)",
            ),
            (
                json!({"text": "x"}),
                "a file given as {path, text|base64|host_path|export_id}: missing field `path`",
            ),
            (
                json!({"source": "/srv/a"}),
                "a file given as {source, destination}: missing field `destination`",
            ),
            (
                json!({"source": "/srv/a", "destination": "a", "text": "x"}),
                "unknown field `text`, expected `source` or `destination`",
            ),
            (
                json!({"session_id": "sb-1", "path": "a"}),
                "a file given as {session_id, path, destination}: missing field `destination`",
            ),
            (
                json!({"destination": "a", "text": "x"}),
                "destination goes with source (a host path) or session_id",
            ),
            (
                json!({"path": "a", "content": "x"}),
                "unknown field `content`",
            ),
        ];
        for (value, wanted) in cases {
            let e = import(value.clone()).unwrap_err();
            assert!(e.contains(wanted), "{value}: {e}");
        }
    }

    #[derive(Debug, Deserialize)]
    struct Files {
        #[serde(deserialize_with = "import_files")]
        files: Vec<ImportFile>,
    }

    #[test]
    fn a_bad_entry_is_named_by_its_index() {
        let e = serde_json::from_value::<Files>(json!({"files": [
            {"path": "a", "text": "x"},
            {"source": "/srv/b"},
        ]}))
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("files[1]: a file given as {source, destination}"),
            "{e}"
        );
        let ok = serde_json::from_value::<Files>(json!({"files": [
            {"path": "a", "text": "x"},
            {"source": "/srv/b", "destination": "b"},
        ]}))
        .unwrap();
        assert_eq!(ok.files.len(), 2);
    }

    #[test]
    fn export_entries() {
        let f: Vec<ExportFile> = serde_json::from_value(json!([{"source": "data.csv"}])).unwrap();
        assert_eq!(f[0].source, "data.csv");
        let e = serde_json::from_value::<Vec<ExportFile>>(json!([{"path": "data.csv"}]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `path`, expected `source`"), "{e}");
    }

    #[test]
    fn absolute_paths() {
        assert_eq!(absolute("data.csv"), "/workspace/data.csv");
        assert_eq!(absolute("./out//a/../b.csv"), "/workspace/out/b.csv");
        assert_eq!(absolute("/tmp/x/"), "/tmp/x");
    }
}

#[cfg(test)]
mod schema_tests {
    use schemars::generate::SchemaSettings;

    /// The tool's input schema as rmcp makes it (draft 2020-12).
    fn schema<T: schemars::JsonSchema>() -> serde_json::Value {
        let root = SchemaSettings::draft2020_12()
            .into_generator()
            .into_root_schema_for::<T>();
        serde_json::to_value(root).unwrap()
    }

    /// The schemas the tools advertise show every shape they take, as `anyOf`.
    #[test]
    fn the_schemas_show_every_shape() {
        let create = schema::<crate::tools::CreateSession>();
        let deps = &create["$defs"]["Dependencies"]["anyOf"];
        assert_eq!(deps[0]["type"], "array", "{create}");
        assert_eq!(deps[0]["items"]["type"], "string");
        assert_eq!(deps[1]["type"], "object");
        assert_eq!(deps[1]["additionalProperties"]["type"], "string");

        let import = schema::<crate::tools::ImportFiles>();
        let shapes: Vec<&serde_json::Value> = import["$defs"]["ImportFile"]["anyOf"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| &import["$defs"][s["$ref"].as_str().unwrap().trim_start_matches("#/$defs/")])
            .collect();
        let required: Vec<serde_json::Value> =
            shapes.iter().map(|s| s["required"].clone()).collect();
        assert_eq!(
            required,
            vec![
                serde_json::json!(["path"]),
                serde_json::json!(["source", "destination"]),
                serde_json::json!(["session_id", "path", "destination"]),
            ],
            "{import}"
        );
        assert!(shapes.iter().all(|s| s["additionalProperties"] == false));

        let export = schema::<crate::tools::ExportFiles>();
        assert_eq!(
            export["required"],
            serde_json::json!(["session_id"]),
            "{export}"
        );
        assert_eq!(
            export["$defs"]["ExportFile"]["required"],
            serde_json::json!(["source"])
        );
        assert!(export["properties"]["paths"]["description"].is_string());
        assert!(export["properties"]["files"]["description"].is_string());
    }
}
