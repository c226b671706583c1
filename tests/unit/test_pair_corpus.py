"""Realistic-pair corpus pieces: file listing, held-out split, tokenizer, windows, repeated 4-grams."""

import os
from pathlib import Path

import pytest


from benchmarks.models import pair_corpus as corpus  # noqa: E402


def test_repeated_ngram_share_hand_made():
    # 4-grams of 1234 1234: 1234 2341 3412 4123 1234 -> one of five is a repeat.
    assert corpus.repeated_ngram_share([[1, 2, 3, 4, 1, 2, 3, 4]]) == pytest.approx(1 / 5)
    # A constant run: 7 four-grams, all equal, 6 repeats.
    assert corpus.repeated_ngram_share([[7] * 10]) == pytest.approx(6 / 7)
    assert corpus.repeated_ngram_share([[1, 2, 3, 4, 5, 6]]) == 0.0
    # Repeats are counted within a sequence, never across sequences.
    assert corpus.repeated_ngram_share([[1, 2, 3, 4], [1, 2, 3, 4]]) == 0.0
    # Positions are pooled over sequences: (1 repeat of 5) + (0 of 3) -> 1/8.
    assert corpus.repeated_ngram_share([[1, 2, 3, 4, 1, 2, 3, 4], [5, 6, 7, 8, 9, 10]]) == pytest.approx(1 / 8)
    assert corpus.repeated_ngram_share([[1, 1, 2]], n=2) == 0.0
    assert corpus.repeated_ngram_share([[1, 2, 3]]) is None
    assert corpus.repeated_ngram_share([]) is None
    with pytest.raises(ValueError, match="n must be"):
        corpus.repeated_ngram_share([[1]], n=0)


def test_list_source_files_sorted_deduped_no_pycache(tmp_path):
    (tmp_path / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / "pkg" / "b.py").write_text("x = 1\n")
    (tmp_path / "pkg" / "a.py").write_text("y = 2\n")
    (tmp_path / "pkg" / "empty.py").write_text("")
    (tmp_path / "pkg" / "notes.txt").write_text("not python")
    (tmp_path / "pkg" / "__pycache__" / "c.py").write_text("z = 3\n")
    (tmp_path / "big.py").write_text("#" * 2000)
    os.symlink(tmp_path / "pkg" / "a.py", tmp_path / "link.py")
    files = corpus.list_source_files([tmp_path, tmp_path / "pkg"], max_file_bytes=1000)
    assert [f.name for f in files] == ["a.py", "b.py"]


def test_split_heldout_is_seeded_disjoint_and_sized():
    files = [Path(f"/x/f{i:03d}.py") for i in range(200)]
    tr, ho = corpus.split_heldout(files, 0.02, seed=3)
    assert len(ho) == 4 and len(tr) == 196 and not set(tr) & set(ho)
    assert corpus.split_heldout(files, 0.02, seed=3) == (tr, ho)
    assert corpus.split_heldout(files, 0.02, seed=4)[1] != ho
    with pytest.raises(ValueError, match="fraction"):
        corpus.split_heldout(files, 0.0, seed=0)


def test_tokenizer_round_trips_code_and_windows():
    pytest.importorskip("tokenizers", reason="tokenizers not installed (pair tokenizer tests need it)")
    pytest.importorskip("torch", reason="torch not installed (token streams are torch tensors)")
    texts = ["def f(x):\n    return x + 1  # ünïcode ✓\n", "class A:\n    pass\n\n\nimport os\n"] * 20
    tok = corpus.train_tokenizer(texts, vocab_size=300)
    assert tok.get_vocab_size() <= 300 and tok.token_to_id(corpus.EOS) == 0
    for t in texts[:2] + ["\t\tweird  spacing\r\n", "α = 'ß'"]:
        ids = tok.encode(t, add_special_tokens=False).ids
        assert tok.decode(ids) == t
    # Merges were learnt: common code compresses below one id per byte.
    assert len(tok.encode(texts[0]).ids) < len(texts[0].encode())
    stream = corpus.encode_stream(tok, texts[:3])
    assert int((stream == 0).sum()) == 3 and int(stream[-1]) == 0
    wins = corpus.windows(stream, 1000, 7)
    assert len(wins) == len(stream) // 7 and all(len(w) == 7 for w in wins)
    assert wins[1] == stream[7:14].tolist()
