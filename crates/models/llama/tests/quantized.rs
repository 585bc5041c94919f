//! Weights kept quantized in memory (`WeightQuantization`): int8 and int4 blocks change the
//! fixture model's logits only by quantization noise, shrink the reported weight memory, and
//! unquantizable shapes are typed errors.

use burn_flex::Flex;
use ipfs_accelerate_conformance::{family_fixtures, relative_error};
use ipfs_accelerate_core::{BackendKind, Error, ModelRunner};
use ipfs_accelerate_llama::{Architecture, LlamaConfig, LlamaRunner, TextGeneration};
use ipfs_accelerate_nn::WeightQuantization;

fn load(dir: &std::path::Path) -> LlamaRunner<Flex> {
    let config = LlamaConfig::from_file(&dir.join("config.json"), Architecture::Llama).unwrap();
    let weights = ipfs_accelerate_io::open_weights(dir).unwrap();
    LlamaRunner::load(weights, &config, &Default::default(), BackendKind::Cpu).unwrap()
}

#[test]
fn quantized_weights_stay_close_and_take_less_memory() {
    for f in family_fixtures("quantized_weights_stay_close_and_take_less_memory", "llama") {
        let mut inputs = f.inputs().unwrap();
        inputs.remove("greedy_steps");
        inputs.remove("greedy_prompt");
        let float = load(&f.dir);
        let reference = float.run(&inputs).unwrap()["logits"].to_f64_vec();
        let float_bytes = TextGeneration::weight_bytes(&float);
        for (q, bound) in [
            (WeightQuantization::Int8 { block_size: 16 }, 5e-2),
            (WeightQuantization::Int4 { block_size: 16 }, 5e-1),
        ] {
            let mut model = load(&f.dir);
            TextGeneration::quantize(&mut model, q).unwrap();
            let logits = model.run(&inputs).unwrap()["logits"].to_f64_vec();
            let err = relative_error(&logits, &reference);
            let bytes = TextGeneration::weight_bytes(&model);
            eprintln!("{q:?}: logits rel err {err:.3e}, weights {bytes} B (float {float_bytes} B)");
            assert!(err > 0.0 && err < bound, "{q:?}: {err}");
            assert!(bytes < float_bytes, "{bytes} vs {float_bytes}");
            // Quantizing twice is refused: the first quantization stays as it was.
            let again = TextGeneration::quantize(&mut model, q).unwrap_err();
            assert!(matches!(again, Error::InvalidInput(_)), "{again}");
        }
        // A block size that does not divide the weights is a typed error, not a panic.
        let mut model = load(&f.dir);
        let odd = WeightQuantization::Int8 { block_size: 251 };
        let err = TextGeneration::quantize(&mut model, odd).unwrap_err();
        assert!(err.to_string().contains("block size"), "{err}");
    }
}
