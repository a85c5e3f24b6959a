//! Embeddings: `POST {base}/embeddings` of the OpenAI protocol (and the compatible servers:
//! vLLM, Ollama, LM Studio, …), with the same keys, retries and error kinds as
//! [`Llm::chat`]. Anthropic has no embeddings endpoint, so a model of that provider is a
//! `Config` error before anything is sent.

use std::time::{Duration, Instant};

use reqwest::header::CONTENT_TYPE;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::client::{Failure, Llm, header_request_id, transport};
use crate::config::normalize_base_url;
use crate::error::{LlmError, LlmErrorKind, parse_error_body, redact};
use crate::model::{ModelRef, ProviderKind};
use crate::response::Usage;
use crate::retry;

/// The vectors of one embeddings call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Embeddings {
    /// One vector per input, in the inputs' order, all of the same length.
    pub vectors: Vec<Vec<f32>>,
    /// The model as the server named it, else the request's.
    pub model: String,
    /// Tokens read (`usage.prompt_tokens`; estimated at four characters a token, and marked
    /// so, when the server reports none). Embeddings write nothing: `output_tokens` is 0.
    pub usage: Usage,
    /// The provider's id of the request, when it sent one.
    pub request_id: Option<String>,
    /// How many attempts it took (1 = no retry).
    pub attempts: u32,
    /// Wall time of the whole call, retries included.
    pub latency_ms: u64,
}

impl Embeddings {
    /// The vectors' length (0 when there are none).
    pub fn dims(&self) -> usize {
        self.vectors.first().map_or(0, Vec::len)
    }
}

/// The request body: every input in one call, asking for floats (some compatible servers
/// default to base64).
pub(crate) fn request_body(model: &str, inputs: &[String]) -> Vec<u8> {
    json!({"model": model, "input": inputs, "encoding_format": "float"})
        .to_string()
        .into_bytes()
}

fn decode_error(what: impl std::fmt::Display) -> LlmError {
    LlmError::new(
        LlmErrorKind::Decode,
        format!("openai embeddings answer is not understood: {what}"),
    )
}

/// The vectors of an answer `{"data": [{"index", "embedding": [..]}], "model", "usage"}`,
/// put in `index` order (the position when a server sends no index); exactly `expected` of
/// them, of one non-zero length, every number finite.
pub(crate) fn parse_response(
    body: &[u8],
    expected: usize,
    inputs: &[String],
    requested_model: &str,
) -> Result<Embeddings, LlmError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| decode_error(format!("{e}")))?;
    if let Some(err) = v.get("error").filter(|e| !e.is_null()) {
        let (message, _) = parse_error_body(body);
        let message = if message.is_empty() {
            err.to_string()
        } else {
            message
        };
        return Err(LlmError::new(
            LlmErrorKind::Server,
            format!("openai reported an error: {message}"),
        ));
    }
    let data = v
        .get("data")
        .and_then(Value::as_array)
        .ok_or_else(|| decode_error("no \"data\" list"))?;
    if data.len() != expected {
        return Err(decode_error(format!(
            "{} vectors for {expected} inputs",
            data.len()
        )));
    }
    let mut slots: Vec<Option<Vec<f32>>> = vec![None; expected];
    for (pos, item) in data.iter().enumerate() {
        let index = match item.get("index").and_then(Value::as_u64) {
            Some(i) => usize::try_from(i).unwrap_or(usize::MAX),
            None => pos,
        };
        let slot = slots
            .get_mut(index)
            .ok_or_else(|| decode_error(format!("index {index} is past the {expected} inputs")))?;
        if slot.is_some() {
            return Err(decode_error(format!("index {index} comes twice")));
        }
        let numbers = item
            .get("embedding")
            .and_then(Value::as_array)
            .ok_or_else(|| decode_error(format!("item {pos} has no \"embedding\" list")))?;
        let vector = numbers
            .iter()
            .map(|n| {
                n.as_f64()
                    .map(|f| f as f32)
                    .filter(|f| f.is_finite())
                    .ok_or_else(|| decode_error(format!("item {pos} holds {n}, not a number")))
            })
            .collect::<Result<Vec<f32>, _>>()?;
        *slot = Some(vector);
    }
    let vectors: Vec<Vec<f32>> = slots.into_iter().flatten().collect();
    let dims = vectors.first().map_or(0, Vec::len);
    if dims == 0 && expected > 0 {
        return Err(decode_error("an empty vector"));
    }
    if vectors.iter().any(|v| v.len() != dims) {
        return Err(decode_error("vectors of different lengths"));
    }
    let reported = v
        .get("usage")
        .and_then(|u| u.get("prompt_tokens").or_else(|| u.get("total_tokens")))
        .and_then(Value::as_u64);
    let usage = match reported {
        Some(n) => Usage {
            input_tokens: n,
            output_tokens: 0,
            estimated: false,
        },
        None => Usage {
            input_tokens: inputs
                .iter()
                .map(|t| crate::message::estimate_tokens(t))
                .sum(),
            output_tokens: 0,
            estimated: true,
        },
    };
    Ok(Embeddings {
        vectors,
        model: v
            .get("model")
            .and_then(Value::as_str)
            .filter(|m| !m.is_empty())
            .unwrap_or(requested_model)
            .to_string(),
        usage,
        request_id: None,
        attempts: 1,
        latency_ms: 0,
    })
}

impl Llm {
    /// The vectors of `inputs` from `model`'s `POST {base}/embeddings` (OpenAI protocol),
    /// in one call; no inputs, no call.
    ///
    /// Keys, base URLs, retries (408/409/429/5xx and transport errors, honouring
    /// `retry-after`) and error kinds are those of [`Llm::chat`]: a missing key for the
    /// official endpoint is a `Config` error naming its variable; 400/401/403/404 fail at
    /// once with the provider's message. An `anthropic/…` model is a `Config` error (that
    /// provider has no embeddings endpoint). An answer with the wrong number of vectors, or
    /// vectors of different lengths, is a `Decode` error.
    pub async fn embed(&self, model: &ModelRef, inputs: &[String]) -> Result<Embeddings, LlmError> {
        if model.provider == ProviderKind::Anthropic {
            return Err(LlmError::config(format!(
                "{model}: anthropic has no embeddings endpoint; name an OpenAI-compatible one (openai/…)"
            )));
        }
        let started = Instant::now();
        if inputs.is_empty() {
            return Ok(Embeddings {
                vectors: Vec::new(),
                model: model.model.clone(),
                usage: Usage::default(),
                request_id: None,
                attempts: 0,
                latency_ms: 0,
            });
        }
        let provider = model.provider;
        let pc = self.config.provider(provider);
        let key = pc.api_key.as_deref().filter(|k| !k.is_empty());
        if key.is_none() && pc.is_official(provider) {
            return Err(LlmError::config(format!(
                "no API key for {provider}: set {}",
                pc.key_env
            )));
        }
        let url = format!("{}/embeddings", normalize_base_url(&pc.base_url));
        let body = request_body(&model.model, inputs);
        let mut attempt: u32 = 1;
        loop {
            match self.embed_attempt(&url, &body, key, inputs, model).await {
                Ok(mut e) => {
                    e.attempts = attempt;
                    e.latency_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                    return Ok(e);
                }
                Err(Failure {
                    mut error,
                    retry_after,
                }) => {
                    error.message = redact(error.message, key);
                    if error.retryable() && attempt <= self.config.retry.max_retries {
                        let wait: Duration = retry::delay(&self.config.retry, attempt, retry_after);
                        attempt += 1;
                        tokio::time::sleep(wait).await;
                        continue;
                    }
                    error.attempts = attempt;
                    return Err(error);
                }
            }
        }
    }

    async fn embed_attempt(
        &self,
        url: &str,
        body: &[u8],
        key: Option<&str>,
        inputs: &[String],
        model: &ModelRef,
    ) -> Result<Embeddings, Failure> {
        let provider = model.provider;
        let mut rb = self
            .http
            .post(url)
            .header(CONTENT_TYPE, "application/json")
            .body(body.to_vec());
        if let Some(k) = key {
            rb = rb.bearer_auth(k);
        }
        let resp = rb
            .send()
            .await
            .map_err(|e| transport(provider, "embeddings request failed", &e))?;
        let request_id = header_request_id(resp.headers());
        let resp = crate::client::failed_status(resp, &format!("{provider} embeddings")).await?;
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| transport(provider, "embeddings answer dropped", &e))?;
        let mut e = parse_response(&bytes, inputs.len(), inputs, &model.model)?;
        e.request_id = request_id;
        Ok(e)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use axum::Router;
    use axum::http::StatusCode;
    use axum::routing::post;

    use super::*;
    use crate::config::{LlmConfig, RetryPolicy};

    fn inputs(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("text {i}")).collect()
    }

    #[test]
    fn answers_are_put_in_index_order_and_checked() {
        let body = br#"{"object":"list","model":"emb-1","data":[
            {"object":"embedding","index":1,"embedding":[0.0,1.0]},
            {"object":"embedding","index":0,"embedding":[1.0,0.5]}],
            "usage":{"prompt_tokens":7,"total_tokens":7}}"#;
        let e = parse_response(body, 2, &inputs(2), "asked").unwrap();
        assert_eq!(e.vectors, vec![vec![1.0, 0.5], vec![0.0, 1.0]]);
        assert_eq!((e.model.as_str(), e.dims()), ("emb-1", 2));
        assert_eq!(
            e.usage,
            Usage {
                input_tokens: 7,
                output_tokens: 0,
                estimated: false
            }
        );
        // No index, no usage, no model: positions, an estimate, the request's model.
        let e = parse_response(br#"{"data":[{"embedding":[3]}]}"#, 1, &inputs(1), "asked").unwrap();
        assert_eq!((e.vectors[0][0], e.model.as_str()), (3.0, "asked"));
        assert!(e.usage.estimated && e.usage.input_tokens > 0);
        for (body, says) in [
            (
                &br#"{"data":[{"embedding":[1]}]}"#[..],
                "1 vectors for 2 inputs",
            ),
            (
                br#"{"data":[{"embedding":[1]},{"embedding":[1,2]}]}"#,
                "different lengths",
            ),
            (
                br#"{"data":[{"index":0,"embedding":[1]},{"index":0,"embedding":[2]}]}"#,
                "twice",
            ),
            (
                br#"{"data":[{"index":5,"embedding":[1]},{"embedding":[2]}]}"#,
                "past",
            ),
            (
                br#"{"data":[{"embedding":["x"]},{"embedding":[1]}]}"#,
                "not a number",
            ),
            (
                br#"{"data":[{"embedding":[]},{"embedding":[]}]}"#,
                "empty vector",
            ),
            (br#"{"nothing":1}"#, "no \"data\""),
            (b"not json", "not understood"),
        ] {
            let err = parse_response(body, 2, &inputs(2), "m").unwrap_err();
            assert_eq!(err.kind, LlmErrorKind::Decode, "{}", err.message);
            assert!(err.message.contains(says), "{}", err.message);
        }
    }

    /// A server answering `/v1/embeddings` with `status` the first `failures` times, then
    /// one vector per input; counts the calls.
    async fn server(status: StatusCode, failures: u32) -> (String, Arc<AtomicU32>) {
        let calls = Arc::new(AtomicU32::new(0));
        let seen = calls.clone();
        let app = Router::new().route(
            "/v1/embeddings",
            post(move |body: axum::Json<Value>| {
                let n = seen.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n < failures {
                        return (status, axum::Json(json!({"error": {"message": "scripted failure", "type": "server_error"}})));
                    }
                    assert_eq!(body["encoding_format"], "float");
                    let data: Vec<Value> = body["input"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .enumerate()
                        .map(|(i, t)| json!({"index": i, "embedding": [t.as_str().unwrap().len() as f64, 1.0]}))
                        .collect();
                    (StatusCode::OK, axum::Json(json!({"data": data, "model": body["model"]})))
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (format!("http://{addr}/v1"), calls)
    }

    fn llm(base: &str) -> Llm {
        let mut c = LlmConfig::from_vars(|_| None);
        c.openai.base_url = base.to_string();
        c.retry = RetryPolicy {
            max_retries: 2,
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(5),
        };
        Llm::new(c).unwrap()
    }

    #[tokio::test]
    async fn embeds_retries_server_errors_and_fails_at_once_on_auth() {
        let model: ModelRef = "openai/emb".parse().unwrap();
        let (base, calls) = server(StatusCode::INTERNAL_SERVER_ERROR, 1).await;
        let e = llm(&base).embed(&model, &inputs(3)).await.unwrap();
        assert_eq!(e.vectors.len(), 3);
        assert_eq!(e.vectors[2], vec![6.0, 1.0]);
        assert_eq!((e.attempts, calls.load(Ordering::SeqCst)), (2, 2));

        let (base, calls) = server(StatusCode::UNAUTHORIZED, 10).await;
        let err = llm(&base).embed(&model, &inputs(1)).await.unwrap_err();
        assert_eq!(
            (err.kind, err.status, err.attempts),
            (LlmErrorKind::Auth, Some(401), 1)
        );
        assert!(err.message.contains("scripted failure"), "{}", err.message);
        assert_eq!(calls.load(Ordering::SeqCst), 1);

        let (base, calls) = server(StatusCode::SERVICE_UNAVAILABLE, 10).await;
        let err = llm(&base).embed(&model, &inputs(1)).await.unwrap_err();
        assert_eq!((err.kind, err.attempts), (LlmErrorKind::Server, 3));
        assert_eq!(calls.load(Ordering::SeqCst), 3);

        // Nothing to embed: no call.
        let e = llm(&base).embed(&model, &[]).await.unwrap();
        assert!(e.vectors.is_empty());
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn anthropic_and_a_missing_official_key_are_config_errors() {
        let l = Llm::new(LlmConfig::from_vars(|_| None)).unwrap();
        let err = l
            .embed(&"anthropic/claude".parse().unwrap(), &inputs(1))
            .await
            .unwrap_err();
        assert_eq!(err.kind, LlmErrorKind::Config);
        assert!(
            err.message.contains("no embeddings endpoint"),
            "{}",
            err.message
        );
        let err = l
            .embed(
                &"openai/text-embedding-3-small".parse().unwrap(),
                &inputs(1),
            )
            .await
            .unwrap_err();
        assert_eq!(err.kind, LlmErrorKind::Config);
        assert!(err.message.contains("OPENAI_API_KEY"), "{}", err.message);
    }
}
