//! Screening incoming JSON-RPC frames before the MCP layer sees them: a frame that is not
//! JSON, or not a valid MCP client message, is answered with a JSON-RPC error here (rmcp would
//! drop it silently on stdio, or answer in plain text over HTTP), and never reaches a tool.

use rmcp::model::ClientJsonRpcMessage;
use serde_json::{Value, json};

/// JSON-RPC: the frame is not JSON.
pub const PARSE_ERROR: i64 = -32700;
/// JSON-RPC: the frame is JSON but not a valid request.
pub const INVALID_REQUEST: i64 = -32600;

/// The JSON-RPC error answering `frame`, or `None` when it is a valid MCP client message.
pub fn screen(frame: &[u8]) -> Option<Value> {
    let value: Value = match serde_json::from_slice(frame) {
        Ok(v) => v,
        Err(e) => return Some(error(Value::Null, PARSE_ERROR, format!("parse error: {e}"))),
    };
    let id = value.get("id").cloned().unwrap_or(Value::Null);
    if !value.is_object() {
        return Some(error(
            id,
            INVALID_REQUEST,
            "invalid request: a frame must be one JSON-RPC object (batches are not supported)"
                .into(),
        ));
    }
    if value.get("jsonrpc") != Some(&json!("2.0")) {
        return Some(error(
            id,
            INVALID_REQUEST,
            "invalid request: \"jsonrpc\" must be \"2.0\"".into(),
        ));
    }
    match serde_json::from_value::<ClientJsonRpcMessage>(value) {
        Ok(_) => None,
        Err(e) => Some(error(id, INVALID_REQUEST, format!("invalid request: {e}"))),
    }
}

fn error(id: Value, code: i64, message: String) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_frames_get_errors_and_good_ones_pass() {
        assert_eq!(screen(b"{not json").unwrap()["error"]["code"], PARSE_ERROR);
        let wrong =
            screen(br#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":5}"#).unwrap();
        assert_eq!(wrong["error"]["code"], INVALID_REQUEST);
        assert_eq!(wrong["id"], 4);
        assert_eq!(screen(b"[1,2]").unwrap()["error"]["code"], INVALID_REQUEST);
        assert_eq!(
            screen(br#"{"id":1,"method":"tools/list"}"#).unwrap()["error"]["code"],
            INVALID_REQUEST
        );
        assert!(screen(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#).is_none());
        assert!(screen(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).is_none());
    }
}
