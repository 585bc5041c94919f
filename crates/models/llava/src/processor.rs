//! HF's `LlavaProcessor` / `LlavaNextProcessor` for a checkpoint folder: the image processor
//! (`preprocessor_config.json`), the tokenizer (`tokenizer.json`), the image placeholder
//! (`processor_config.json`) and the chat template, turning images and a question into model
//! input with every `<image>` expanded to the image's feature count.

use std::path::{Path, PathBuf};

use ipfs_accelerate_core::{Error, HostTensor, Result};
use ipfs_accelerate_preprocess::chat::render_chat_template as render_chat;
use ipfs_accelerate_preprocess::image::{ImageProcessor, RgbImage};
use minijinja::value::Value;
use tokenizers::Tokenizer;

use crate::runner::LlavaTasks;

/// Model input for one prompt: token ids with the image placeholders expanded, the pixel values
/// and (LLaVA-NeXT) the original image sizes.
#[derive(Debug, Clone)]
pub struct LlavaInputs {
    /// Prompt token ids, each `<image>` expanded to its image's feature count.
    pub input_ids: Vec<u32>,
    /// `[images, 3, H, W]` (LLaVA) or `[images, views, 3, H, W]` (LLaVA-NeXT); `None` without
    /// images.
    pub pixel_values: Option<HostTensor>,
    /// `[images, 2]` original `(height, width)` (LLaVA-NeXT).
    pub image_sizes: Option<HostTensor>,
}

/// The processor of a LLaVA / LLaVA-NeXT checkpoint folder.
pub struct LlavaProcessor {
    images: ImageProcessor,
    tokenizer: Tokenizer,
    image_token: String,
    image_token_id: u32,
    chat_template: Option<String>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    origin: PathBuf,
}

fn read_json(path: &Path) -> Result<Option<serde_json::Value>> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| Error::config(path, e.to_string()))
}

/// A special token of `tokenizer_config.json` (a string or `{"content": ...}`).
fn special_token(config: Option<&serde_json::Value>, key: &str) -> Option<String> {
    match config?.get(key)? {
        serde_json::Value::String(s) => Some(s.clone()),
        v => v.get("content")?.as_str().map(str::to_string),
    }
}

/// The chat template of a checkpoint folder: `chat_template.jinja`, `chat_template.json`,
/// `processor_config.json` or `tokenizer_config.json`, the first that has one.
fn find_chat_template(dir: &Path, processor: Option<&serde_json::Value>) -> Result<Option<String>> {
    let jinja = dir.join("chat_template.jinja");
    if jinja.is_file() {
        return std::fs::read_to_string(&jinja)
            .map(Some)
            .map_err(|e| Error::io(&jinja, e));
    }
    let from = |v: Option<serde_json::Value>| {
        v.and_then(|v| v.get("chat_template")?.as_str().map(str::to_string))
    };
    if let Some(t) = from(read_json(&dir.join("chat_template.json"))?) {
        return Ok(Some(t));
    }
    if let Some(t) = from(processor.cloned()) {
        return Ok(Some(t));
    }
    ipfs_accelerate_llama::read_chat_template(dir)
}

/// Removes HF's `{% generation %}` / `{% endgeneration %}` markers (they only mark assistant
/// tokens for training masks and render nothing).
fn strip_generation_tags(template: &str) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(start) = rest.find("{%") {
        // The closing `%}` comes after the opening `{%` (in `{%}` the `%` is not shared).
        let Some(len) = rest[start + 2..].find("%}").map(|i| i + 2) else {
            break;
        };
        let tag = &rest[start + 2..start + len];
        let name = tag.trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        out.push_str(&rest[..start]);
        if name != "generation" && name != "endgeneration" {
            out.push_str(&rest[start..start + len + 2]);
        }
        rest = &rest[start + len + 2..];
    }
    out.push_str(rest);
    out
}

/// Renders an HF multimodal chat template for one user turn holding `images` image entries and
/// then `text`, with the generation prompt.
pub fn render_chat_template(
    template: &str,
    text: &str,
    images: usize,
    bos_token: Option<&str>,
    eos_token: Option<&str>,
) -> Result<String> {
    let mut content: Vec<Value> = (0..images)
        .map(|_| minijinja::context! { type => "image" })
        .collect();
    content.push(minijinja::context! { type => "text", text => text });
    let ctx = minijinja::context! {
        messages => vec![minijinja::context! { role => "user", content => content }],
        add_generation_prompt => true,
        bos_token => bos_token.unwrap_or_default(),
        eos_token => eos_token.unwrap_or_default(),
    };
    Ok(render_chat(&strip_generation_tags(template), ctx)?)
}

impl LlavaProcessor {
    /// Reads the processor files of a checkpoint folder: `preprocessor_config.json` and
    /// `tokenizer.json` (required), `processor_config.json` (`image_token`, default `<image>`),
    /// `tokenizer_config.json` (BOS / EOS strings) and the chat template (optional).
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let images = ImageProcessor::from_file(dir.join("preprocessor_config.json"))?;
        let tok_path = dir.join("tokenizer.json");
        let tokenizer =
            Tokenizer::from_file(&tok_path).map_err(|e| Error::config(&tok_path, e.to_string()))?;
        let processor = read_json(&dir.join("processor_config.json"))?;
        let image_token = processor
            .as_ref()
            .and_then(|p| p.get("image_token")?.as_str().map(str::to_string))
            .unwrap_or_else(|| "<image>".to_string());
        let image_token_id = tokenizer.token_to_id(&image_token).ok_or_else(|| {
            Error::config(
                &tok_path,
                format!("the tokenizer has no image token `{image_token}`"),
            )
        })?;
        let tok_config = read_json(&dir.join("tokenizer_config.json"))?;
        Ok(LlavaProcessor {
            images,
            tokenizer,
            image_token,
            image_token_id,
            chat_template: find_chat_template(dir, processor.as_ref())?,
            bos_token: special_token(tok_config.as_ref(), "bos_token"),
            eos_token: special_token(tok_config.as_ref(), "eos_token"),
            origin: dir.to_path_buf(),
        })
    }

    /// The image processor.
    pub fn image_processor(&self) -> &ImageProcessor {
        &self.images
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The placeholder string (`<image>`) and its id.
    pub fn image_token(&self) -> (&str, u32) {
        (&self.image_token, self.image_token_id)
    }

    /// The chat template, if the checkpoint ships one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// A question about `images` images as the model expects it: through the chat template when
    /// there is one (a user turn with the images first, then the text, and the generation
    /// prompt), else LLaVA-1.5's `USER: <image>\n{text} ASSISTANT:`.
    pub fn chat_prompt(&self, text: &str, images: usize) -> Result<String> {
        match &self.chat_template {
            Some(t) => render_chat_template(
                t,
                text,
                images,
                self.bos_token.as_deref(),
                self.eos_token.as_deref(),
            ),
            None => Ok(format!(
                "USER: {}{text} ASSISTANT:",
                format!("{}\n", self.image_token).repeat(images)
            )),
        }
    }

    /// Token ids of `prompt` (BOS added by the tokenizer unless the prompt already starts with
    /// it).
    pub fn encode(&self, prompt: &str) -> Result<Vec<u32>> {
        if prompt.is_empty() {
            return Err(Error::InvalidInput("empty prompt".into()));
        }
        let has_bos = self
            .bos_token
            .as_deref()
            .is_some_and(|b| !b.is_empty() && prompt.starts_with(b));
        let enc = self
            .tokenizer
            .encode(prompt, !has_bos)
            .map_err(|e| Error::InvalidInput(format!("tokenizing the prompt: {e}")))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of generated ids (special tokens dropped).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.tokenizer
            .decode(ids, true)
            .map_err(|e| Error::InvalidInput(format!("decoding tokens: {e}")))
    }

    /// Model input for `images` and `prompt` (which holds one `<image>` per image, e.g. from
    /// [`chat_prompt`](Self::chat_prompt)): the images preprocessed, the prompt tokenised and
    /// every placeholder expanded to the feature count `model` gives its image.
    pub fn prepare(
        &self,
        model: &dyn LlavaTasks,
        images: &[RgbImage],
        prompt: &str,
    ) -> Result<LlavaInputs> {
        let wanted = model.config().image_token_id;
        if i64::from(self.image_token_id) != wanted {
            return Err(Error::config(
                &self.origin,
                format!(
                    "the tokenizer's `{}` is id {}, the model's image_token_id is {wanted}",
                    self.image_token, self.image_token_id
                ),
            ));
        }
        let ids = self.encode(prompt)?;
        if images.is_empty() {
            let expanded = model.expand_image_tokens(&ids, &[])?;
            return Ok(LlavaInputs {
                input_ids: expanded,
                pixel_values: None,
                image_sizes: None,
            });
        }
        let processed = self.images.preprocess(images)?;
        Ok(LlavaInputs {
            input_ids: model.expand_image_tokens(&ids, &processed.original_sizes)?,
            pixel_values: Some(processed.pixel_values),
            image_sizes: processed.image_sizes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `chat_template.json` of `llava-hf/llava-1.5-7b-hf`.
    const LLAVA_15: &str = "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': '}}{% endif %}{# Render all images first #}{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}{# Render all text next #}{% if message['role'] != 'assistant' %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] + ' '}}{% endfor %}{% else %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{% generation %}{{ content['text'] + ' '}}{% endgeneration %}{% endfor %}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}";

    #[test]
    fn overlapping_tag_delimiters_do_not_panic() {
        // Fuzz finding 1: `{%}` used to slice rest[start + 2..start + 1].
        assert_eq!(strip_generation_tags("\0{%}"), "\0{%}");
        assert_eq!(
            strip_generation_tags("a{% generation %}b{%}{% endgeneration %}"),
            "ab{%}{% endgeneration %}"
        );
    }

    #[test]
    fn llava_chat_template_renders_as_hf() {
        let p = render_chat_template(LLAVA_15, "What is this?", 1, Some("<s>"), None).unwrap();
        assert_eq!(p, "USER: <image>\nWhat is this? ASSISTANT:");
        let two = render_chat_template(LLAVA_15, "Compare.", 2, None, None).unwrap();
        assert_eq!(two, "USER: <image>\n<image>\nCompare. ASSISTANT:");
        assert!(render_chat_template("{{ x.nope() }}", "t", 0, None, None).is_err());
        assert!(render_chat_template("{% if %}", "t", 0, None, None).is_err());
    }

    #[test]
    fn generation_markers_are_removed() {
        assert_eq!(
            strip_generation_tags("a{%- generation -%}b{% endgeneration %}c{% if x %}d{% endif %}"),
            "abc{% if x %}d{% endif %}"
        );
        assert_eq!(strip_generation_tags("{% unterminated"), "{% unterminated");
    }
}
