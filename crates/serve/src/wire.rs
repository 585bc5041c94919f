//! Request and response bodies: OpenAI's (`/v1/...`) and text-embeddings-inference's (`/embed`,
//! `/predict`), as their clients send and expect them.

use serde::{Deserialize, Serialize};

/// A string or a list of strings (OpenAI's `input` / `prompt` / `stop`, TEI's `inputs`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    /// One string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

impl OneOrMany {
    /// The strings, in order.
    pub fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

/// OpenAI's embeddings `input`: text(s), or token ids, which this server refuses by name.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum EmbeddingInput {
    /// Text(s).
    Text(OneOrMany),
    /// Token ids (one or several sequences).
    Tokens(serde_json::Value),
}

/// `POST /v1/embeddings`.
#[derive(Debug, Clone, Deserialize)]
pub struct EmbeddingsRequest {
    /// The served model's name.
    pub model: String,
    /// What to embed.
    pub input: EmbeddingInput,
    /// `float` (default) or `base64` (little-endian f32 bytes; the `openai` Python client asks for
    /// it).
    #[serde(default)]
    pub encoding_format: Option<String>,
    /// Not supported (the model's own width is returned); refused when it differs.
    #[serde(default)]
    pub dimensions: Option<usize>,
    /// Extension: cut over-long inputs to the model's length instead of refusing them.
    #[serde(default)]
    pub truncate: bool,
    /// Ignored (OpenAI's end-user id).
    #[serde(default)]
    pub user: Option<String>,
}

/// One vector of an embeddings response.
#[derive(Debug, Clone, Serialize)]
pub struct EmbeddingData {
    /// `embedding`.
    pub object: &'static str,
    /// Position in the input.
    pub index: usize,
    /// The vector.
    pub embedding: Embedding,
}

/// An embedding as the request's `encoding_format` asks.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Embedding {
    /// A JSON array of numbers (each the shortest text that reads back as the same f32).
    Float(Vec<f32>),
    /// Base64 of the little-endian f32 bytes.
    Base64(String),
}

/// Token counts of a response.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Usage {
    /// Tokens of the input(s).
    pub prompt_tokens: usize,
    /// Tokens generated (absent for embeddings).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_tokens: Option<usize>,
    /// The sum.
    pub total_tokens: usize,
}

/// The `POST /v1/embeddings` answer.
#[derive(Debug, Clone, Serialize)]
pub struct EmbeddingsResponse {
    /// `list`.
    pub object: &'static str,
    /// One entry per input.
    pub data: Vec<EmbeddingData>,
    /// The model's name.
    pub model: String,
    /// Input tokens.
    pub usage: Usage,
}

/// Sampling fields shared by completions and chat completions.
#[derive(Debug, Clone, Deserialize, Default)]
pub struct SamplingFields {
    /// Tokens to generate at most.
    #[serde(default)]
    pub max_tokens: Option<usize>,
    /// The newer name of `max_tokens` (chat).
    #[serde(default)]
    pub max_completion_tokens: Option<usize>,
    /// Softmax temperature (0 = greedy; OpenAI's default is 1).
    #[serde(default)]
    pub temperature: Option<f32>,
    /// Nucleus sampling mass (default 1 = off).
    #[serde(default)]
    pub top_p: Option<f32>,
    /// Extension (vLLM, llama.cpp): keep only the `top_k` most likely tokens.
    #[serde(default)]
    pub top_k: Option<usize>,
    /// Seed of the sampler (same seed, same prompt, same settings: same text).
    #[serde(default)]
    pub seed: Option<u64>,
    /// Up to 4 strings that end the generation (not returned).
    #[serde(default)]
    pub stop: Option<OneOrMany>,
    /// Stream server-sent events.
    #[serde(default)]
    pub stream: bool,
    /// `{"include_usage": true}` adds a last chunk with the usage.
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    /// Choices per prompt; only 1 is supported.
    #[serde(default)]
    pub n: Option<usize>,
    /// Extension (HF's repetition penalty; 1 = off).
    #[serde(default)]
    pub repetition_penalty: Option<f32>,
}

/// OpenAI's `stream_options`.
#[derive(Debug, Clone, Copy, Deserialize, Default)]
pub struct StreamOptions {
    /// Send a final chunk with the usage.
    #[serde(default)]
    pub include_usage: bool,
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    /// The served model's name.
    pub model: String,
    /// The prompt (a list must hold exactly one).
    pub prompt: OneOrMany,
    /// Sampling, limits, streaming.
    #[serde(flatten)]
    pub sampling: SamplingFields,
}

/// A chat message's content: a string, or OpenAI's list of typed parts (text parts only).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Parts: `{"type": "text", "text": ...}`.
    Parts(Vec<ContentPart>),
}

/// One part of a message's content.
#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    /// `text` (other types are refused by name).
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a text part.
    #[serde(default)]
    pub text: Option<String>,
}

/// One message of a chat request.
#[derive(Debug, Clone, Deserialize)]
pub struct RequestMessage {
    /// `system`, `user`, `assistant` (`developer` is read as `system`).
    pub role: String,
    /// The text.
    #[serde(default)]
    pub content: Option<Content>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    /// The served model's name.
    pub model: String,
    /// The conversation.
    pub messages: Vec<RequestMessage>,
    /// Sampling, limits, streaming.
    #[serde(flatten)]
    pub sampling: SamplingFields,
}

/// TEI's `POST /embed`.
#[derive(Debug, Clone, Deserialize)]
pub struct TeiEmbedRequest {
    /// Text(s).
    pub inputs: OneOrMany,
    /// L2-normalise (TEI's default: true).
    #[serde(default = "yes")]
    pub normalize: bool,
    /// Cut over-long inputs instead of refusing them (TEI's default: false).
    #[serde(default)]
    pub truncate: bool,
    /// Extension: the served model's name (default: the only encoder, or the first).
    #[serde(default)]
    pub model: Option<String>,
}

/// TEI's `POST /predict`.
#[derive(Debug, Clone, Deserialize)]
pub struct TeiPredictRequest {
    /// Text(s).
    pub inputs: OneOrMany,
    /// Cut over-long inputs instead of refusing them.
    #[serde(default)]
    pub truncate: bool,
    /// Extension: the served model's name.
    #[serde(default)]
    pub model: Option<String>,
}

fn yes() -> bool {
    true
}

/// Seconds since the Unix epoch (OpenAI's `created`).
pub fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
