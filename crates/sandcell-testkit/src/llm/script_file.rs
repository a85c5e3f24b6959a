//! Scripts written as JSON (the `scripted-llm` binary's `--script` file), so test suites in
//! other languages can script the server.
//!
//! A script is a list of turns, or an object `{"turns": [...], "usage": {"input_tokens",
//! "output_tokens"}, "chunk_bytes": n, "embeddings": {"dims": n, "synonyms": [["car",
//! "automobile"]], "fault": <fault>}}` (`embeddings`: how `POST /v1/embeddings` answers; its
//! fault, one of the shapes below, fails every embeddings request). A turn is one of:
//!
//! ```json
//! {"text": "…"}
//! {"tool_calls": [{"name": "run_code", "arguments": {"code": "print(1)"}}]}
//! {"text": "…", "tool_calls": [...]}
//! {"fault": {"status": 429, "retry_after": "0", "message": "slow down"}}
//! {"fault": "drop_stream"} | {"fault": "overloaded"} | {"fault": "unauthorized"}
//! {"slow": {"delay_ms": 500, "then": {"text": "…"}}}
//! ```

use serde_json::Value;

use super::{EmbeddingsScript, Fault, Script, ScriptedCall, Turn, Usage};

/// Why a JSON script was refused.
#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    /// The text is not JSON.
    #[error("script is not valid json: {0}")]
    Json(#[from] serde_json::Error),
    /// The JSON is not of a script's shape.
    #[error("script {at}: {reason}")]
    Shape {
        /// Where in the script (e.g. `turn 2`).
        at: String,
        /// What is wrong there.
        reason: String,
    },
}

fn shape(at: impl Into<String>, reason: impl Into<String>) -> ScriptError {
    ScriptError::Shape {
        at: at.into(),
        reason: reason.into(),
    }
}

impl Script {
    /// A script from its JSON text (see the module docs of the shapes); the turns are
    /// queued, nothing decides after them unless [`Script::respond_with`] is added.
    pub fn from_json(text: &str) -> Result<Script, ScriptError> {
        let v: Value = serde_json::from_str(text)?;
        let (turns, rest) = match &v {
            Value::Array(turns) => (turns.as_slice(), None),
            Value::Object(o) => {
                let turns = o
                    .get("turns")
                    .and_then(Value::as_array)
                    .ok_or_else(|| shape("", "an object script needs a \"turns\" list"))?;
                (turns.as_slice(), Some(o))
            }
            _ => {
                return Err(shape(
                    "",
                    "expected a list of turns or an object with \"turns\"",
                ));
            }
        };
        let mut script = Script::new();
        for (i, t) in turns.iter().enumerate() {
            script = script.turn(Turn::from_json(t).map_err(|e| match e {
                ScriptError::Shape { at, reason } => shape(
                    format!("turn {i}{}{at}", if at.is_empty() { "" } else { " " }),
                    reason,
                ),
                other => other,
            })?);
        }
        if let Some(o) = rest {
            if let Some(u) = o.get("usage") {
                let field = |k: &str| {
                    u.get(k)
                        .and_then(Value::as_u64)
                        .ok_or_else(|| shape("usage", format!("\"{k}\" must be a number")))
                };
                script = script.usage(Usage {
                    input_tokens: field("input_tokens")?,
                    output_tokens: field("output_tokens")?,
                });
            }
            if let Some(n) = o.get("chunk_bytes") {
                let n = n
                    .as_u64()
                    .ok_or_else(|| shape("chunk_bytes", "must be a number"))?;
                script = script.chunk_bytes(usize::try_from(n).unwrap_or(usize::MAX));
            }
            if let Some(e) = o.get("embeddings") {
                script = script.embeddings(embeddings_from_json(e)?);
            }
        }
        Ok(script)
    }
}

impl Turn {
    /// One turn from its JSON shape (see [`Script::from_json`]).
    pub fn from_json(v: &Value) -> Result<Turn, ScriptError> {
        let o = v
            .as_object()
            .ok_or_else(|| shape("", "a turn is an object"))?;
        if let Some(f) = o.get("fault") {
            return fault_from_json(f).map(Turn::Fault);
        }
        if let Some(s) = o.get("slow") {
            let delay_ms = s
                .get("delay_ms")
                .and_then(Value::as_u64)
                .ok_or_else(|| shape("slow", "needs \"delay_ms\" (a number)"))?;
            let then = s
                .get("then")
                .ok_or_else(|| shape("slow", "needs \"then\" (a turn)"))?;
            let then = Turn::from_json(then)?;
            return Ok(Turn::Fault(Fault::Slow {
                delay_ms,
                then: Box::new(then),
            }));
        }
        let text = match o.get("text") {
            None => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => return Err(shape("text", "must be a string")),
        };
        let calls = match o.get("tool_calls") {
            None => None,
            Some(Value::Array(calls)) if !calls.is_empty() => Some(
                calls
                    .iter()
                    .map(call_from_json)
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            Some(_) => return Err(shape("tool_calls", "must be a non-empty list")),
        };
        match (text, calls) {
            (Some(t), None) => Ok(Turn::Text(t)),
            (None, Some(c)) => Ok(Turn::ToolCalls(c)),
            (Some(t), Some(c)) => Ok(Turn::TextAndToolCalls(t, c)),
            (None, None) => Err(shape(
                "",
                "expected \"text\", \"tool_calls\", \"fault\" or \"slow\"",
            )),
        }
    }
}

fn embeddings_from_json(v: &Value) -> Result<EmbeddingsScript, ScriptError> {
    let o = v
        .as_object()
        .ok_or_else(|| shape("embeddings", "must be an object"))?;
    let mut e = EmbeddingsScript::default();
    if let Some(d) = o.get("dims") {
        e.dims = d
            .as_u64()
            .and_then(|d| usize::try_from(d).ok())
            .filter(|d| (1..=65_536).contains(d))
            .ok_or_else(|| shape("embeddings dims", "must be a number from 1 to 65536"))?;
    }
    if let Some(groups) = o.get("synonyms") {
        let groups = groups
            .as_array()
            .ok_or_else(|| shape("embeddings synonyms", "must be a list of lists of words"))?;
        for g in groups {
            let words = g
                .as_array()
                .and_then(|ws| ws.iter().map(Value::as_str).collect::<Option<Vec<_>>>())
                .ok_or_else(|| shape("embeddings synonyms", "each group is a list of words"))?;
            e = e.synonyms(words);
        }
    }
    if let Some(f) = o.get("fault") {
        e.fault = Some(fault_from_json(f).map_err(|err| match err {
            ScriptError::Shape { reason, .. } => shape("embeddings fault", reason),
            other => other,
        })?);
    }
    Ok(e)
}

fn call_from_json(v: &Value) -> Result<ScriptedCall, ScriptError> {
    let name = v
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| shape("tool_calls", "each call needs a \"name\" string"))?;
    let arguments = v
        .get("arguments")
        .cloned()
        .unwrap_or_else(|| Value::Object(Default::default()));
    Ok(ScriptedCall::new(name, arguments))
}

fn fault_from_json(f: &Value) -> Result<Fault, ScriptError> {
    match f {
        Value::String(s) => match s.as_str() {
            "drop_stream" => Ok(Fault::DropStream),
            "overloaded" => Ok(Fault::Overloaded),
            "unauthorized" => Ok(Fault::Unauthorized),
            other => Err(shape(
                "fault",
                format!("unknown fault {other:?} (drop_stream, overloaded, unauthorized)"),
            )),
        },
        Value::Object(o) => {
            let status = o
                .get("status")
                .and_then(Value::as_u64)
                .and_then(|s| u16::try_from(s).ok())
                .filter(|s| (100..=999).contains(s))
                .ok_or_else(|| shape("fault", "\"status\" must be an HTTP status number"))?;
            let retry_after = match o.get("retry_after") {
                None | Some(Value::Null) => None,
                Some(Value::String(s)) => Some(s.clone()),
                Some(Value::Number(n)) => Some(n.to_string()),
                Some(_) => {
                    return Err(shape("fault", "\"retry_after\" must be a string or number"));
                }
            };
            let message = match o.get("message") {
                None => format!("scripted error {status}"),
                Some(Value::String(m)) => m.clone(),
                Some(_) => return Err(shape("fault", "\"message\" must be a string")),
            };
            Ok(Fault::Status {
                status,
                retry_after,
                message,
            })
        }
        _ => Err(shape("fault", "expected a name or {\"status\": …}")),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn every_turn_shape_parses() {
        let s = Script::from_json(
            r#"[
                {"text": "hi"},
                {"tool_calls": [{"name": "a", "arguments": {"x": 1}}, {"name": "b"}]},
                {"text": "t", "tool_calls": [{"name": "a", "arguments": {}}]},
                {"fault": {"status": 429, "retry_after": "0"}},
                {"fault": {"status": 500, "retry_after": 2, "message": "boom"}},
                {"fault": "drop_stream"}, {"fault": "overloaded"}, {"fault": "unauthorized"},
                {"slow": {"delay_ms": 5, "then": {"text": "late"}}}
            ]"#,
        )
        .expect("valid script");
        let turns: Vec<Turn> = s.turns.into_iter().collect();
        assert_eq!(
            turns,
            vec![
                Turn::text("hi"),
                Turn::ToolCalls(vec![
                    ScriptedCall::new("a", json!({"x": 1})),
                    ScriptedCall::new("b", json!({}))
                ]),
                Turn::TextAndToolCalls("t".into(), vec![ScriptedCall::new("a", json!({}))]),
                Turn::Fault(Fault::Status {
                    status: 429,
                    retry_after: Some("0".into()),
                    message: "scripted error 429".into()
                }),
                Turn::Fault(Fault::Status {
                    status: 500,
                    retry_after: Some("2".into()),
                    message: "boom".into()
                }),
                Turn::Fault(Fault::DropStream),
                Turn::Fault(Fault::Overloaded),
                Turn::Fault(Fault::Unauthorized),
                Turn::Fault(Fault::Slow {
                    delay_ms: 5,
                    then: Box::new(Turn::text("late"))
                }),
            ]
        );
    }

    #[test]
    fn object_form_sets_usage_and_chunks() {
        let s = Script::from_json(
            r#"{"turns": [{"text": "a"}], "usage": {"input_tokens": 3, "output_tokens": 4}, "chunk_bytes": 2}"#,
        )
        .expect("valid script");
        assert_eq!(
            s.usage,
            Usage {
                input_tokens: 3,
                output_tokens: 4
            }
        );
        assert_eq!(s.chunk_bytes, 2);
        assert_eq!(s.turns.len(), 1);
        let s = Script::from_json(
            r#"{"turns": [], "embeddings": {"dims": 8, "synonyms": [["Car", "automobile"]], "fault": {"status": 500}}}"#,
        )
        .expect("valid script");
        assert_eq!(s.embeddings.dims, 8);
        assert_eq!(
            s.embeddings.synonyms,
            vec![vec!["car".to_string(), "automobile".to_string()]]
        );
        assert_eq!(
            s.embeddings.fault,
            Some(Fault::status(500, "scripted error 500"))
        );
        assert!(Script::from_json(r#"{"turns": [], "embeddings": {"dims": 0}}"#).is_err());
        assert!(
            Script::from_json(r#"{"turns": [], "embeddings": {"synonyms": ["car"]}}"#).is_err()
        );
    }

    #[test]
    fn bad_scripts_say_where() {
        let e =
            Script::from_json(r#"[{"text": "a"}, {"fault": "melt"}]"#).expect_err("unknown fault");
        assert!(e.to_string().contains("turn 1 fault"), "{e}");
        assert!(e.to_string().contains("melt"), "{e}");
        assert!(Script::from_json("{").is_err());
        assert!(Script::from_json(r#"[{"nothing": 1}]"#).is_err());
        assert!(Script::from_json(r#"[{"fault": {"status": 70000}}]"#).is_err());
        assert!(Script::from_json(r#"[{"tool_calls": []}]"#).is_err());
    }
}
