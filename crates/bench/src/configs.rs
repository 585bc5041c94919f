//! Named model configurations (the `config.json` of well-known checkpoints) that benchmarks run
//! with random weights, so no download is needed: `--config minilm-l6` and so on. Weights are
//! seeded random values ([`ipfs_accelerate_io::RandomInit`]), so outputs are meaningless but every
//! matmul, attention and norm is the real model's at its real size.

/// `(name, family, config.json)` of every named configuration.
pub const PRESETS: &[(&str, &str, &str)] = &[
    ("minilm-l6", "bert", MINILM_L6),
    ("bert-base", "bert", BERT_BASE),
    ("vit-base", "vit", VIT_BASE),
    ("clip-vit-b32", "clip", CLIP_VIT_B32),
    ("whisper-tiny", "whisper", WHISPER_TINY),
    ("whisper-base", "whisper", WHISPER_BASE),
    ("wav2vec2-base", "wav2vec2", WAV2VEC2_BASE),
    ("detr-resnet50", "detr", DETR_RESNET50),
    ("t5-small", "t5", T5_SMALL),
    ("t5-base", "t5", T5_BASE),
    ("llama-135m", "llama", SMOLLM2_135M),
    ("llama-1b", "llama", LLAMA_32_1B),
    ("qwen2-0.5b", "qwen2", QWEN25_05B),
];

/// The family and config.json text of a named configuration.
pub fn preset(name: &str) -> Option<(&'static str, &'static str)> {
    PRESETS
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, family, json)| (*family, *json))
}

/// The names of every preset, for messages.
pub fn preset_names() -> Vec<&'static str> {
    PRESETS.iter().map(|(n, _, _)| *n).collect()
}

/// facebook/detr-resnet-50, its ResNet-50 backbone written as transformers' own ResNet config
/// (the checkpoint names timm's `resnet50`, the same network), 91 COCO classes.
const DETR_RESNET50: &str = r#"{"model_type":"detr","use_timm_backbone":false,"use_pretrained_backbone":false,
 "backbone_config":{"model_type":"resnet","num_channels":3,"embedding_size":64,"hidden_sizes":[256,512,1024,2048],
 "depths":[3,4,6,3],"layer_type":"bottleneck","hidden_act":"relu","downsample_in_first_stage":false,
 "out_features":["stage4"]},"num_queries":100,"d_model":256,"encoder_layers":6,"decoder_layers":6,
 "encoder_ffn_dim":2048,"decoder_ffn_dim":2048,"encoder_attention_heads":8,"decoder_attention_heads":8,
 "activation_function":"relu","position_embedding_type":"sine","dilation":false,"num_labels":91}"#;
/// sentence-transformers/all-MiniLM-L6-v2.
const MINILM_L6: &str = r#"{"model_type":"bert","vocab_size":30522,"hidden_size":384,"num_hidden_layers":6,
 "num_attention_heads":12,"intermediate_size":1536,"hidden_act":"gelu","max_position_embeddings":512,
 "type_vocab_size":2,"layer_norm_eps":1e-12,"pad_token_id":0}"#;
/// google-bert/bert-base-uncased.
const BERT_BASE: &str = r#"{"model_type":"bert","vocab_size":30522,"hidden_size":768,"num_hidden_layers":12,
 "num_attention_heads":12,"intermediate_size":3072,"hidden_act":"gelu","max_position_embeddings":512,
 "type_vocab_size":2,"layer_norm_eps":1e-12,"pad_token_id":0}"#;
/// google/vit-base-patch16-224-in21k (ViTModel).
const VIT_BASE: &str = r#"{"model_type":"vit","hidden_size":768,"num_hidden_layers":12,"num_attention_heads":12,
 "intermediate_size":3072,"hidden_act":"gelu","image_size":224,"patch_size":16,"num_channels":3,
 "qkv_bias":true,"layer_norm_eps":1e-12}"#;
/// openai/clip-vit-base-patch32.
const CLIP_VIT_B32: &str = r#"{"model_type":"clip","projection_dim":512,"logit_scale_init_value":2.6592,
 "text_config":{"vocab_size":49408,"hidden_size":512,"intermediate_size":2048,"num_hidden_layers":12,
  "num_attention_heads":8,"max_position_embeddings":77,"hidden_act":"quick_gelu","layer_norm_eps":1e-5,
  "bos_token_id":49406,"eos_token_id":49407,"pad_token_id":1},
 "vision_config":{"hidden_size":768,"intermediate_size":3072,"num_hidden_layers":12,"num_attention_heads":12,
  "image_size":224,"patch_size":32,"num_channels":3,"hidden_act":"quick_gelu","layer_norm_eps":1e-5}}"#;
/// openai/whisper-tiny.
const WHISPER_TINY: &str = r#"{"model_type":"whisper","vocab_size":51865,"num_mel_bins":80,"d_model":384,
 "encoder_layers":4,"decoder_layers":4,"encoder_attention_heads":6,"decoder_attention_heads":6,
 "encoder_ffn_dim":1536,"decoder_ffn_dim":1536,"max_source_positions":1500,"max_target_positions":448,
 "decoder_start_token_id":50258,"pad_token_id":50257,"bos_token_id":50257,"eos_token_id":50257}"#;
/// openai/whisper-base.
const WHISPER_BASE: &str = r#"{"model_type":"whisper","vocab_size":51865,"num_mel_bins":80,"d_model":512,
 "encoder_layers":6,"decoder_layers":6,"encoder_attention_heads":8,"decoder_attention_heads":8,
 "encoder_ffn_dim":2048,"decoder_ffn_dim":2048,"max_source_positions":1500,"max_target_positions":448,
 "decoder_start_token_id":50258,"pad_token_id":50257,"bos_token_id":50257,"eos_token_id":50257}"#;
/// facebook/wav2vec2-base-960h.
const WAV2VEC2_BASE: &str = r#"{"model_type":"wav2vec2","vocab_size":32,"hidden_size":768,"num_hidden_layers":12,
 "num_attention_heads":12,"intermediate_size":3072,"hidden_act":"gelu","layer_norm_eps":1e-5,
 "feat_extract_norm":"group","feat_extract_activation":"gelu","conv_bias":false,
 "conv_dim":[512,512,512,512,512,512,512],"conv_kernel":[10,3,3,3,3,2,2],"conv_stride":[5,2,2,2,2,2,2],
 "num_conv_pos_embeddings":128,"num_conv_pos_embedding_groups":16,"do_stable_layer_norm":false,
 "pad_token_id":0}"#;
/// google-t5/t5-small.
const T5_SMALL: &str = r#"{"model_type":"t5","vocab_size":32128,"d_model":512,"d_kv":64,"d_ff":2048,
 "num_layers":6,"num_decoder_layers":6,"num_heads":8,"relative_attention_num_buckets":32,
 "relative_attention_max_distance":128,"feed_forward_proj":"relu","layer_norm_epsilon":1e-6,
 "tie_word_embeddings":true,"decoder_start_token_id":0,"pad_token_id":0,"eos_token_id":1}"#;
/// google-t5/t5-base.
const T5_BASE: &str = r#"{"model_type":"t5","vocab_size":32128,"d_model":768,"d_kv":64,"d_ff":3072,
 "num_layers":12,"num_decoder_layers":12,"num_heads":12,"relative_attention_num_buckets":32,
 "relative_attention_max_distance":128,"feed_forward_proj":"relu","layer_norm_epsilon":1e-6,
 "tie_word_embeddings":true,"decoder_start_token_id":0,"pad_token_id":0,"eos_token_id":1}"#;
/// HuggingFaceTB/SmolLM2-135M.
const SMOLLM2_135M: &str = r#"{"model_type":"llama","vocab_size":49152,"hidden_size":576,"intermediate_size":1536,
 "num_hidden_layers":30,"num_attention_heads":9,"num_key_value_heads":3,"tie_word_embeddings":true,
 "max_position_embeddings":8192,"rope_theta":100000.0,"rms_norm_eps":1e-5,"hidden_act":"silu"}"#;
/// meta-llama/Llama-3.2-1B (llama3 rope scaling).
const LLAMA_32_1B: &str = r#"{"model_type":"llama","vocab_size":128256,"hidden_size":2048,"intermediate_size":8192,
 "num_hidden_layers":16,"num_attention_heads":32,"num_key_value_heads":8,"head_dim":64,"tie_word_embeddings":true,
 "max_position_embeddings":131072,"rope_theta":500000.0,"rms_norm_eps":1e-5,"hidden_act":"silu",
 "rope_scaling":{"rope_type":"llama3","factor":32.0,"low_freq_factor":1.0,"high_freq_factor":4.0,
  "original_max_position_embeddings":8192}}"#;
/// Qwen/Qwen2.5-0.5B.
const QWEN25_05B: &str = r#"{"model_type":"qwen2","vocab_size":151936,"hidden_size":896,"intermediate_size":4864,
 "num_hidden_layers":24,"num_attention_heads":14,"num_key_value_heads":2,"tie_word_embeddings":true,
 "max_position_embeddings":32768,"rope_theta":1000000.0,"rms_norm_eps":1e-6,"hidden_act":"silu"}"#;

#[cfg(test)]
mod tests {
    #[test]
    fn presets_are_json_objects_with_a_model_type() {
        for (name, family, json) in super::PRESETS {
            let v: serde_json::Value =
                serde_json::from_str(json).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(v.get("model_type").is_some(), "{name}");
            assert!(!family.is_empty());
        }
    }
}
