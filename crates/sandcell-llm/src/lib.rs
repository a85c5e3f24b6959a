//! Sandcell's LLM provider layer: thin hand-written clients of the OpenAI Chat Completions
//! protocol (OpenAI and the many servers that speak it: vLLM, Ollama, OpenRouter, …) and the
//! Anthropic Messages protocol, streamed and not.
//!
//! One provider-neutral conversation ([`ChatRequest`] of [`Message`]s of [`Part`]s) is mapped
//! onto each protocol's wire format (`openai.rs`, `anthropic.rs`: pure functions, tested
//! without a network); answers come back as one [`ChatResponse`] with text, tool calls, the
//! finish reason and [`Usage`] (estimated and marked so when the server sent none).
//! [`Llm::chat`] adds what every caller needs: retries with backoff honouring `retry-after`,
//! errors classified into a closed [`LlmErrorKind`] set, and [`PriceTable`] costs.
//! [`Llm::embed`] calls an OpenAI-compatible `/embeddings` endpoint (memories' hybrid
//! ranking) with the same keys, retries and error kinds.
//!
//! The crate knows nothing of the engine or the agent: the agent runtime drives it and writes
//! the same types into its trajectory (hence serde on all of them).

#![forbid(unsafe_code)]

mod anthropic;
mod client;
mod config;
mod embeddings;
mod error;
mod message;
mod model;
mod openai;
mod pricing;
mod response;
mod retry;
pub mod sse;

pub use client::Llm;
pub use config::{
    ANTHROPIC_DEFAULT_BASE_URL, LlmConfig, LlmSettings, OPENAI_DEFAULT_BASE_URL, ProviderConfig,
    ProviderSettings, RetryPolicy,
};
pub use embeddings::Embeddings;
pub use error::{LlmError, LlmErrorKind};
pub use message::{
    ChatRequest, IMAGE_TOKEN_ESTIMATE, Image, Message, Part, Role, ToolCall, ToolResult, ToolSpec,
    estimate_input_tokens, estimate_tokens,
};
pub use model::{ModelRef, ProviderKind};
pub use pricing::{Price, PriceTable};
pub use response::{ChatResponse, FinishReason, StreamDelta, Usage};
