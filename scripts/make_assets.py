"""Generate titan_morph's bundled training text and tokenizer (deterministic, no network).

Writes ``titan_morph/assets/text/corpus.txt`` (one document per line, ~1 MB of procedurally
generated English-like text: small stories, counting and arithmetic facts) and
``titan_morph/assets/tokenizer/{tokenizer.json,tokenizer_config.json}`` (a byte-level BPE with
``VOCAB_SIZE`` ids, below the llama3 debug model's 2048-entry vocabulary).

Run from the repository root: ``python scripts/make_assets.py [--out DIR]``. The output is
byte-for-byte reproducible (a test regenerates it and compares).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

VOCAB_SIZE = 1024
NUM_DOCS = 2000
SEED = 20260101
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"

NAMES = "Ada Ben Cleo Dan Eve Finn Gus Hana Ivo Jill Kai Lena Milo Nora Otto Pia Quinn Rosa Sam Tess".split()
ANIMALS = "cat dog fox owl bear deer frog goat hare lion mole seal swan wolf crow duck".split()
COLORS = "red blue green yellow white black brown grey orange purple".split()
SIZES = "small big tiny huge little tall short".split()
PLACES = "forest river hill garden market village lake field bridge harbour".split()
VERBS = "found saw followed painted carried fed watched helped chased called".split()
OBJECTS = "apple basket lantern stone feather book kite shell map key boat drum".split()
TIMES = "In the morning|At noon|In the evening|At night|On Monday|On a rainy day|Last spring".split("|")
FEELINGS = "happy tired curious brave sleepy proud calm hungry".split()
NUMBERS = "zero one two three four five six seven eight nine ten eleven twelve".split()


def _story(rng: random.Random) -> str:
    """A short story whose later sentences refer back to earlier ones (learnable structure)."""
    hero, friend = rng.sample(NAMES, 2)
    animal, color, size = rng.choice(ANIMALS), rng.choice(COLORS), rng.choice(SIZES)
    place, obj = rng.choice(PLACES), rng.choice(OBJECTS)
    sentences = [
        f"{rng.choice(TIMES)}, {hero} went to the {place}.",
        f"There {hero} {rng.choice(VERBS)} a {size} {color} {animal}.",
        f"The {animal} had a {obj}.",
        f"{hero} called {friend}, and {friend} came to the {place} too.",
        f"Together they {rng.choice(VERBS)} the {color} {animal} and its {obj}.",
        f"{hero} felt {rng.choice(FEELINGS)} and {friend} felt {rng.choice(FEELINGS)}.",
    ]
    n = rng.randint(3, len(sentences))
    return " ".join(sentences[:n])


def _counting(rng: random.Random) -> str:
    start = rng.randint(0, 6)
    length = rng.randint(3, 6)
    words = NUMBERS[start : start + length]
    return "Counting: " + ", ".join(words) + "."


def _arithmetic(rng: random.Random) -> str:
    a, b = rng.randint(0, 6), rng.randint(0, 6)
    return f"{NUMBERS[a]} plus {NUMBERS[b]} is {NUMBERS[a + b]}."


def make_corpus(num_docs: int = NUM_DOCS, seed: int = SEED) -> list[str]:
    """``num_docs`` documents, each a few paragraphs of stories, counting and sums."""
    rng = random.Random(seed)
    makers = (_story, _story, _story, _counting, _arithmetic)
    docs = []
    for _ in range(num_docs):
        parts = [rng.choice(makers)(rng) for _ in range(rng.randint(3, 7))]
        docs.append(" ".join(parts))
    return docs


def make_tokenizer(docs: list[str], vocab_size: int = VOCAB_SIZE):
    """Byte-level BPE trained on ``docs``; ids 0 and 1 are BOS and EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer=trainer)
    if tok.get_vocab_size() > 2048:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} ids; the llama3 debug model allows 2048")
    return tok


def write_assets(out: Path) -> None:
    docs = make_corpus()
    text_dir, tok_dir = out / "text", out / "tokenizer"
    text_dir.mkdir(parents=True, exist_ok=True)
    tok_dir.mkdir(parents=True, exist_ok=True)
    (text_dir / "corpus.txt").write_text("\n".join(docs) + "\n", encoding="utf-8")
    tok = make_tokenizer(docs)
    # Canonical JSON so the file is byte-reproducible.
    tok_json = json.loads(tok.to_str())
    (tok_dir / "tokenizer.json").write_text(json.dumps(tok_json, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    config = {"bos_token": BOS, "eos_token": EOS, "add_bos_token": True, "add_eos_token": True}
    (tok_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=1, sort_keys=True) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_out = Path(__file__).resolve().parent.parent / "titan_morph" / "assets"
    parser.add_argument("--out", type=Path, default=default_out, help="assets folder (default: %(default)s)")
    args = parser.parse_args()
    write_assets(args.out)
    print(f"wrote {args.out}/text/corpus.txt and {args.out}/tokenizer/")


if __name__ == "__main__":
    main()
