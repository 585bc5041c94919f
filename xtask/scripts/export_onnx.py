#!/usr/bin/env python3
"""Export a BERT-family checkpoint folder (e.g. all-MiniLM-L6-v2) to ONNX for the ONNX Runtime
backend: writes <out>/model.onnx with inputs input_ids / attention_mask / token_type_ids (int64,
dynamic batch and sequence) and output last_hidden_state, plus a copy of config.json.

usage: export_onnx.py MODEL_DIR OUT_DIR        (needs torch + transformers from PyPI)
"""
import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoModel


def main() -> None:
    src, out = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    model = AutoModel.from_pretrained(src, attn_implementation="eager").eval()
    ids = torch.ones(2, 16, dtype=torch.int64)
    args = (ids, torch.ones_like(ids), torch.zeros_like(ids))
    dyn = {0: "batch", 1: "sequence"}

    class Wrapper(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.m(input_ids=input_ids, attention_mask=attention_mask,
                          token_type_ids=token_type_ids).last_hidden_state

    torch.onnx.export(
        Wrapper(model), args, str(out / "model.onnx"),
        input_names=["input_ids", "attention_mask", "token_type_ids"],
        output_names=["last_hidden_state"],
        dynamic_axes={"input_ids": dyn, "attention_mask": dyn, "token_type_ids": dyn,
                      "last_hidden_state": dyn},
        opset_version=17, dynamo=False,
    )
    for f in ["config.json", "tokenizer.json", "vocab.txt"]:
        if (src / f).exists():
            shutil.copy(src / f, out / f)
    print(out / "model.onnx")


if __name__ == "__main__":
    main()
