"""titan_morph's bundled text dataset and tokenizer, registered with TorchTitan.

``[training] dataset = "morph_text"`` trains on ``titan_morph/assets/text/corpus.txt`` (generated
by ``scripts/make_assets.py``; one document per line) and ``[model] hf_assets_path`` may point at
:data:`TOKENIZER_DIR`. No network and no files outside the package are needed.
"""

from pathlib import Path

ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"
CORPUS_FILE = ASSETS_DIR / "text" / "corpus.txt"
TOKENIZER_DIR = ASSETS_DIR / "tokenizer"
DATASET_NAME = "morph_text"  # TorchTitan lower-cases dataset names before the lookup


def load_text_lines(path: str):
    """A map-style HF ``Dataset`` with one ``text`` row per non-empty line of ``path``.

    ``path`` is a file, or a folder holding ``corpus.txt``; ``[training] dataset_path`` overrides it.
    """
    from datasets import Dataset

    file = Path(path)
    if file.is_dir():
        file = file / "corpus.txt"
    if not file.is_file():
        raise FileNotFoundError(f"dataset {DATASET_NAME}: text file {file} not found")
    lines = [line for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
    return Dataset.from_dict({"text": lines})


def _text(sample: dict) -> str:
    return sample["text"]


def register_dataset() -> None:
    """Add ``morph_text`` to TorchTitan's dataset table (idempotent)."""
    from torchtitan.hf_datasets import DatasetConfig
    from torchtitan.hf_datasets.text_datasets import DATASETS

    DATASETS[DATASET_NAME] = DatasetConfig(path=str(CORPUS_FILE), loader=load_text_lines, sample_processor=_text)
