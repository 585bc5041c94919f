//! Extractive question answering:
//! `cargo run --example qa -- --model ./squad-bert "Where does Ada live?" "Ada lives in London."`
mod common;

use ipfs_accelerate::{Pipeline, Task};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = common::args("qa --model M QUESTION CONTEXT [--backend B]", None)?;
    let [question, context] = &args.inputs[..] else {
        return Err("give a question and a context".into());
    };
    let mut builder = Pipeline::builder(&args.model).task(Task::QuestionAnswering);
    if let Some(list) = args.options.backends {
        builder = builder.backends(list);
    }
    let out = builder.build()?.answer(question, context)?;
    println!("{:?} (score {:.3})", out.value.text, out.value.score);
    Ok(())
}
