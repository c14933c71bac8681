"""The bundled dataset and tokenizer: reproducible, small, and usable by TorchTitan's data path."""

from __future__ import annotations

import subprocess
import sys

from tests.launch import REPO
from titan_morph.integration.data import ASSETS_DIR, CORPUS_FILE, DATASET_NAME, TOKENIZER_DIR, load_text_lines

DEBUG_VOCAB = 2048  # TorchTitan's llama3 debugmodel vocab_size


def test_assets_are_reproducible_and_small(tmp_path):
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_assets.py"), "--out", str(tmp_path)], check=True)
    for rel in ("text/corpus.txt", "tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json"):
        assert (tmp_path / rel).read_bytes() == (ASSETS_DIR / rel).read_bytes(), f"{rel} differs from the script output"
    total = sum(p.stat().st_size for p in ASSETS_DIR.rglob("*") if p.is_file())
    assert total <= 2 * 1024 * 1024, f"assets take {total} bytes"


def test_tokenizer_ids_fit_the_debug_model():
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    tok = HuggingFaceTokenizer(str(TOKENIZER_DIR))
    assert tok.get_vocab_size() < DEBUG_VOCAB
    text = CORPUS_FILE.read_text(encoding="utf-8")[:20000] + " ünïcödé 123 {}"
    ids = tok.encode(text, add_bos=True, add_eos=True)
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
    assert max(ids) < DEBUG_VOCAB and min(ids) >= 0
    assert tok.decode(ids[1:-1]) == text  # byte-level BPE is lossless


def test_dataset_registered_and_yields_sequences():
    from torchtitan.components.tokenizer import HuggingFaceTokenizer
    from torchtitan.hf_datasets.text_datasets import DATASETS, HuggingFaceTextDataset

    from titan_morph.integration.data import register_dataset

    register_dataset()
    assert DATASET_NAME in DATASETS
    assert len(load_text_lines(str(CORPUS_FILE.parent))) == len(CORPUS_FILE.read_text().splitlines())
    ds = HuggingFaceTextDataset(DATASET_NAME, None, HuggingFaceTokenizer(str(TOKENIZER_DIR)), seq_len=64)
    first = [next(it) for it in [iter(ds)] for _ in range(3)]
    for inputs, labels in first:
        assert inputs["input"].shape == labels.shape == (64,)
        assert (inputs["input"][1:] == labels[:-1]).all()
