//! # ipfs-accelerate-wav2vec2
//!
//! A port of HF transformers' `modeling_wav2vec2.py` (`Wav2Vec2Model`, `Wav2Vec2ForCTC`), generic
//! over burn's `Backend`: the convolutional feature encoder (group norm on the first layer, or
//! layer norm on every layer), the feature projection, the weight-normed positional convolution
//! (`weight_g` / `weight_v` or `parametrizations.weight.original0` / `original1`), the post-LN or
//! "stable" pre-LN transformer encoder with attention masks, and the CTC head. [`CtcVocab`] turns
//! frame argmax ids into text as HF's `Wav2Vec2CTCTokenizer` does. The model is described once
//! ([`describe`]): the burn model runs that description, and [`encoder_spec`] reads it as host
//! values for the engines that do not run through burn.

mod config;
mod ctc;
mod model;
mod runner;
mod spec;

pub use config::{FeatExtractNorm, Wav2Vec2Config};
pub use ctc::{ctc_collapse, CtcVocab};
pub use model::{Wav2Vec2, Wav2Vec2Model, Wav2Vec2Output};
pub use runner::{
    CtcArgmax, CtcTranscription, Wav2Vec2Family, Wav2Vec2OnRunner, Wav2Vec2Runner, Wav2Vec2Tasks,
};
pub use spec::{ctc_head, describe, encoder_spec};
