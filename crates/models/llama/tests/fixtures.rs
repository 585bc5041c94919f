//! HF reference fixtures (`<root>/{llama,qwen2}/<variant>/`): logits within the fixture's
//! tolerance and greedy tokens equal. Roots: the shared fixtures (`$IPFS_ACCELERATE_SHARED/fixtures`,
//! else `../shared/fixtures` beside the workspace) and any extra roots in
//! `$IPFS_ACCELERATE_EXTRA_FIXTURES` (colon-separated), e.g. a set generated with other sizes.

use burn_flex::Flex;
use ipfs_accelerate_conformance::{assert_checks, family_fixtures, verify_runner};
use ipfs_accelerate_core::{BackendKind, Family};
use ipfs_accelerate_llama::{LlamaFamily, Qwen2Family};

#[test]
fn reference_fixtures() {
    let mut checked = 0;
    for family in ["llama", "qwen2"] {
        for f in &family_fixtures("reference_fixtures", family) {
            let device = Default::default();
            let runner = match family {
                "llama" => LlamaFamily::load::<Flex>(&f.dir, &device, BackendKind::Cpu),
                _ => Qwen2Family::load::<Flex>(&f.dir, &device, BackendKind::Cpu),
            }
            .unwrap();
            let checks = verify_runner(f, BackendKind::Cpu, runner.as_ref()).unwrap();
            eprintln!("{checks:?}");
            assert_checks(&checks);
            checked += 1;
        }
    }
    eprintln!("{checked} llama / qwen2 fixtures checked");
}
