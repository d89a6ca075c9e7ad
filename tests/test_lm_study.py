"""The LM study's harness (benchmarks/evidence/lm_study.py) and the byte n-gram model (zpx_hf_train/ngram.py):
split determinism, resume, the extrapolation scoring, lr selection, the exact permutation test, the n-gram counts."""

import itertools
import math
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from benchmarks.evidence import lm_study, stats
from benchmarks.evidence.rows import read_rows
from zpx_hf_train.ngram import NgramModel


def _source_tree(root: Path, files: int = 24) -> Path:
    """A small source tree: .py files of varied text, plus what the corpus must leave out."""
    rng = np.random.default_rng(0)
    words = ["def", "return", "self", "import", "class", "if", "else", "for", "in", "None", "x", "y", "(", ")", ":"]
    for i in range(files):
        path = root / ("pkg" if i % 3 else "") / f"mod_{i:02d}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(" ".join(rng.choice(words, 8)) for _ in range(60 + 7 * i)) + "\n")
    for skipped in ("test/test_x.py", "pkg/tests/test_y.py", "idlelib/idle_test/t.py", "site-packages/m/a.py"):
        (root / skipped).parent.mkdir(parents=True, exist_ok=True)
        (root / skipped).write_text("LEFT_OUT = 1\n")
    (root / "data.txt").write_text("not python\n")
    return root


# ---- corpus ---------------------------------------------------------------------------------------------------


def test_the_split_is_by_file_deterministic_and_complete(tmp_path):
    root = _source_tree(tmp_path)
    files = lm_study.source_files(root)
    assert len(files) == 24 and files == sorted(files)
    assert not any("test" in f or "site-packages" in f or not f.endswith(".py") for f in files)
    first, again = lm_study.split_files(files), lm_study.split_files(list(files))
    assert first == again
    assert sorted(itertools.chain(*first.values())) == files  # every file in exactly one split
    assert [len(first[s]) for s in ("train", "val", "test")] == [22, 1, 1]  # 90 / 5 / 5, at least one each
    assert lm_study.split_files(files, seed=1) != first  # the seed decides the split
    corpus, reread = lm_study.load_corpus(root), lm_study.load_corpus(root)
    assert corpus.fingerprint == reread.fingerprint
    assert all(np.array_equal(corpus.data[s], reread.data[s]) for s in corpus.data)
    assert corpus.fingerprint["bytes"] == sum(corpus.fingerprint["split_bytes"].values())
    test_bytes = b"".join((root / f).read_bytes() for f in first["test"])
    assert corpus.data["test"].tobytes() == test_bytes
    (root / "pkg" / "mod_01.py").write_text("changed\n")  # another stdlib: another fingerprint
    assert lm_study.load_corpus(root).fingerprint["content_sha256"] != corpus.fingerprint["content_sha256"]


def test_a_bpe_trained_on_the_train_split_covers_every_byte_and_blocks_map_to_their_bytes(tmp_path):
    corpus = lm_study.load_corpus(_source_tree(tmp_path))
    spec = lm_study.SIZES["lm_smoke_bpe"]
    bpe = lm_study.tokenize(corpus, spec)
    again = lm_study.tokenize(lm_study.load_corpus(tmp_path), spec)
    assert bpe.fingerprint["tokenizer"] == again.fingerprint["tokenizer"]  # deterministic: rows can be resumed
    assert 260 < bpe.vocab <= spec.vocab_size and int(max(t.max() for t in bpe.tokens.values())) < bpe.vocab
    tokenizer = lm_study.train_bpe(corpus.data["train"], spec.vocab_size)
    for split in ("train", "val", "test"):
        ids, nbytes = bpe.tokens[split], bpe.token_bytes[split]
        assert len(ids) < len(corpus.data[split])  # merges happened
        pieces = [tokenizer.decode([i]).encode() for i in ids.tolist()]  # each token's bytes, independently
        assert [len(piece) for piece in pieces] == nbytes.tolist()
        assert b"".join(pieces) == corpus.data[split].tobytes()
    test, nbytes = bpe.tokens["test"], bpe.token_bytes["test"]
    ends = lm_study.block_ends(len(test), longest=32, block=8)
    positions = lm_study.scored_bytes(nbytes, ends, 8)
    data = corpus.data["test"].tobytes()
    expected = b"".join(tokenizer.decode(test[e - 7 : e + 1].tolist()).encode() for e in ends)
    assert bytes(data[i] for i in positions) == expected  # a block's bytes are its 8 target tokens', in order
    assert lm_study.mean_block_bytes(nbytes, ends, 8) == len(expected) / len(ends)
    byte_study = lm_study.tokenize(lm_study.load_corpus(tmp_path), lm_study.SIZES["lm_smoke"])
    assert "tokenizer" not in byte_study.fingerprint
    assert lm_study.mean_block_bytes(byte_study.token_bytes["test"], ends, 8) == 8.0


def test_bits_per_byte_over_blocks_of_unequal_bytes_is_total_bits_over_total_bytes():
    torch.manual_seed(0)
    spec = lm_study.SIZES["lm_smoke"]
    model = lm_study.build_model("baseline", {"hidden": 16, "intermediate": 40}, 1, 2, lm_study.io_shape(spec))
    model = model.double().eval()
    rng = np.random.default_rng(2)
    tokens = torch.from_numpy(rng.integers(4, 260, 120))
    nbytes = rng.integers(1, 6, 120)  # what each token stands for
    ends = lm_study.block_ends(len(tokens), longest=32, block=8)
    norm = lm_study.mean_block_bytes(nbytes, ends, 8)
    bits = lm_study.block_bits(model, tokens, ends, 32, block=8, block_bytes=norm)
    total_bits = total_bytes = 0.0
    for end in ends:
        window = tokens[end - 32 : end + 1]
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=window[None, :-1]).logits[0].double(), -1)
        total_bits += sum(-logp[i, window[i + 1]].item() for i in range(24, 32)) / math.log(2)
        total_bytes += nbytes[end - 7 : end + 1].sum()
    assert bits.mean() == pytest.approx(total_bits / total_bytes, rel=1e-12)


# ---- scoring --------------------------------------------------------------------------------------------------


class PositionModel(torch.nn.Module):
    """Logits whose token-0 entry at position i is i (every target is a byte token, never 0): the nll at position
    i is log(V - 1 + e^i), so the scored positions can be read off the result."""

    def __init__(self, vocab: int = 260) -> None:
        super().__init__()
        self.vocab = vocab
        self.anchor = torch.nn.Parameter(torch.zeros(()))

    def forward(self, input_ids, use_cache=False):
        batch, length = input_ids.shape
        logits = torch.zeros(batch, length, self.vocab, dtype=torch.float64)
        logits[..., 0] = torch.arange(length, dtype=torch.float64)
        return SimpleNamespace(logits=logits)


def test_extrapolation_scoring_reads_exactly_the_last_block_positions():
    tokens = lm_study.tokens_of(np.arange(300, dtype=np.uint8) % 200)
    ends = lm_study.block_ends(len(tokens), longest=64, block=16)
    assert ends[0] == 64 and ends[-1] + 1 <= len(tokens) and set(np.diff(ends)) == {16}
    for context in (16, 32, 64):
        bits = lm_study.block_bits(PositionModel(), tokens, ends, context, block=16)
        scored = np.arange(context - 16, context)
        expected = np.log(259 + np.exp(scored)).mean() / math.log(2)
        np.testing.assert_allclose(bits, expected, rtol=1e-12)


def test_block_bits_matches_an_independent_float64_computation():
    torch.manual_seed(0)
    spec = lm_study.SIZES["lm_smoke"]
    model = lm_study.build_model("baseline", {"hidden": 16, "intermediate": 40}, 1, 2, lm_study.io_shape(spec))
    model = model.double()
    tokens = lm_study.tokens_of(np.random.default_rng(1).integers(0, 256, 200).astype(np.uint8))
    ends = lm_study.block_ends(len(tokens), longest=64, block=16)
    bits = lm_study.block_bits(model, tokens, ends, 48, block=16, batch=3)
    model.eval()
    for got, end in zip(bits, ends):
        window = tokens[end - 48 : end + 1]  # 48 inputs and the target after the last
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=window[None, :-1]).logits[0].double(), -1)
        nll = [-logp[i, window[i + 1]].item() for i in range(48 - 16, 48)]
        assert got == pytest.approx(sum(nll) / 16 / math.log(2), rel=1e-12)
        assert window[-16:].tolist() == tokens[end - 15 : end + 1].tolist()  # the scored targets


# ---- plan -----------------------------------------------------------------------------------------------------


def _done(values: dict[float, float | None], variant: str = "baseline", seeds: tuple[int, ...] = ()) -> dict:
    done = {}
    for lr, value in values.items():
        row = {"status": "ok", "val_bpb": value} if value is not None else {"status": "failed: FloatingPointError"}
        done[(variant, lm_study.SELECT_SEED, lr)] = row
    return done


def test_lr_selection_widens_an_edge_pick_and_never_reports_the_selection_seed():
    spec = lm_study.SIZES["lm_smoke"]
    assert lm_study.selection("baseline", {})["missing"] == list(lm_study.LR_START)
    interior = lm_study.selection("baseline", _done({3e-4: 3.0, 1e-3: 2.0, 3e-3: 2.5}))
    assert interior["pick"] == 1e-3 and not interior["edge"] and interior["grid"] == list(lm_study.LR_START)
    high = lm_study.selection("baseline", _done({3e-4: 3.0, 1e-3: 2.5, 3e-3: 2.0}))
    assert high["pick"] is None and high["missing"] == [1e-2]  # the pick on the edge: the next lr beyond it
    widened = lm_study.selection("baseline", _done({3e-4: 3.0, 1e-3: 2.5, 3e-3: 2.0, 1e-2: None}))
    assert widened["pick"] == 3e-3 and not widened["edge"]  # a diverged lr beyond the pick makes it interior
    low = lm_study.selection("baseline", _done({1e-4: 1.0, 3e-4: 2.0, 1e-3: 3.0, 3e-3: 4.0, 3e-5: 1.5}))
    assert low["pick"] == 1e-4 and low["grid"][0] == 3e-5
    bottom = lm_study.selection("baseline", _done(dict.fromkeys(lm_study.LR_LADDER[:5], 1.0) | {3e-5: 0.5}))
    assert bottom["pick"] == 3e-5 and bottom["edge"]  # the ladder's end: reported as an edge pick
    jobs = lm_study.runnable(spec, _done({3e-4: 3.0, 1e-3: 2.0, 3e-3: 2.5}))
    assert [j for j in jobs if j[0] == "baseline"] == [("baseline", s, 1e-3) for s in spec.report_seeds]
    assert lm_study.SELECT_SEED not in spec.report_seeds and lm_study.SELECT_SEED not in lm_study.LM.report_seeds


def test_a_tiny_bpe_study_trains_scores_and_records_its_tokenizer(tmp_path):
    root = _source_tree(tmp_path / "src")
    argv = ["--size", "lm_smoke_bpe", "--corpus", str(root), "--output", str(tmp_path / "out"), "--max-runs", "1"]
    lm_study.main(argv)
    (row,) = read_rows(tmp_path / "out" / "lm_study_lm_smoke_bpe.jsonl")
    vocab = row["corpus"]["tokenizer"]["vocab_size"]  # up to 400: as many merges as the tiny corpus has
    assert row["status"] == "ok" and 260 < vocab <= 400
    assert row["embedding_params"] == vocab * row["hidden"]  # the model's vocabulary is the BPE's
    assert math.isfinite(row["val_bpb"]) and "BPE" in (tmp_path / "out" / "lm_study_lm_smoke_bpe.md").read_text()


def test_a_tiny_study_records_provenance_and_a_rerun_skips_finished_rows(tmp_path):
    root = _source_tree(tmp_path / "src")
    argv = ["--size", "lm_smoke", "--corpus", str(root), "--output", str(tmp_path / "out")]
    lm_study.main([*argv, "--max-runs", "2"])
    path = tmp_path / "out" / "lm_study_lm_smoke.jsonl"
    first = read_rows(path)
    assert [(r["variant"], r["seed"], r["lr"]) for r in first] == [("baseline", 0, 3e-4), ("baseline", 0, 1e-3)]
    assert all(
        r["status"] == "ok" and r["commit"] and r["command"] and r["machine"] and r["stage"] == "select" for r in first
    )
    assert all("test_bpb@16" not in r for r in first)  # the selection seed is never tested
    lm_study.main([*argv, "--max-runs", "1"])
    rows = read_rows(path)
    assert len(rows) == 3 and rows[:2] == first and (rows[2]["variant"], rows[2]["lr"]) == ("baseline", 3e-3)
    claims = tmp_path / "out" / "lm_study_lm_smoke.claims"
    spec, protocol = lm_study.SIZES["lm_smoke"], rows[0]["protocol"]
    todo = lm_study.runnable(spec, lm_study.index_rows(rows, protocol))
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as other:
        try:  # another live study trains the next job: this one takes the one after it, a dead study's claim
            lm_study.claim_path(claims, todo[0]).write_text(str(other.pid))
            lm_study.claim_path(claims, todo[1]).write_text("999999999")
            lm_study.main([*argv, "--max-runs", "1"])
        finally:
            other.kill()
    rows = read_rows(path)
    assert len(rows) == 4 and (rows[3]["variant"], rows[3]["seed"], rows[3]["lr"]) == todo[1]
    assert [p.name for p in claims.iterdir()] == [lm_study.claim_path(claims, todo[0]).name]  # its own is released
    (root / "mod_00.py").write_text("another corpus\n")
    with pytest.raises(SystemExit) as stop:  # rows of another corpus are refused, never mixed in
        lm_study.main([*argv, "--max-runs", "1"])
    assert stop.value.code == 2 and len(read_rows(path)) == 4


# ---- statistics -----------------------------------------------------------------------------------------------


def _brute_permutation(a, b):
    pooled, na = [*a, *b], len(a)
    observed = abs(np.mean(a) - np.mean(b))
    hits = total = 0
    for order in itertools.permutations(range(len(pooled))):  # every relabelling, n! of them
        x = [pooled[i] for i in order[:na]]
        y = [pooled[i] for i in order[na:]]
        hits += abs(np.mean(x) - np.mean(y)) >= observed - 1e-12
        total += 1
    return hits / total


@pytest.mark.parametrize(
    "a,b", [([2.10, 2.12, 2.15], [2.20, 2.18, 2.25]), ([1.0, 3.0, 2.0], [2.5, 1.5]), ([1.0, 1.0, 2.0], [1.0, 2.0, 2.0])]
)
def test_the_exact_permutation_test_matches_brute_force_and_scipy(a, b):
    result = stats.permutation_test(a, b)
    assert result["p"] == pytest.approx(_brute_permutation(a, b), abs=1e-12)
    assert result["diff"] == pytest.approx(np.mean(a) - np.mean(b))
    scipy_stats = pytest.importorskip("scipy.stats")
    ref = scipy_stats.permutation_test(
        (a, b), lambda x, y: np.mean(x) - np.mean(y), permutation_type="independent", n_resamples=np.inf
    )
    assert result["p"] == pytest.approx(ref.pvalue, abs=1e-12)


def test_three_against_three_seeds_cannot_reach_below_one_tenth():
    result = stats.permutation_test([1.0, 1.1, 1.2], [2.0, 2.1, 2.2])
    assert result["p"] == pytest.approx(0.1) and result["min_p"] == pytest.approx(0.1) and result["splits"] == 20


# ---- byte n-grams ---------------------------------------------------------------------------------------------


def _witten_bell(train: bytes, order: int, alphabet: int, history: bytes, symbol: int) -> float:
    """P(symbol | history) by direct counting over `train` (the module docstring's recursion)."""
    p = 1.0 / alphabet
    for k in range(1, order + 1):
        if len(history) < k - 1:
            break
        h = history[len(history) - (k - 1) :] if k > 1 else b""
        grams = Counter(train[i : i + k] for i in range(len(train) - k + 1))
        following = {g[-1]: c for g, c in grams.items() if g[:-1] == h}
        c_h, t_h = sum(following.values()), len(following)
        if c_h:
            p = (following.get(symbol, 0) + t_h * p) / (c_h + t_h)
    return p


@pytest.mark.parametrize("order", [1, 2, 3, 5])
def test_the_ngram_model_matches_brute_force_counts(order):
    train = b"abracadabra cadabra abba\nbarbara cab\n"
    test = b"abracab bca zz\nab"
    model = NgramModel(order).fit(np.frombuffer(train, np.uint8))
    bits = model.bits(np.frombuffer(test, np.uint8))
    expected = [-math.log2(_witten_bell(train, order, 256, test[:t], test[t])) for t in range(len(test))]
    np.testing.assert_allclose(bits, expected, rtol=1e-12)
    targets = np.array([3, 9, 15])
    np.testing.assert_allclose(model.bits(np.frombuffer(test, np.uint8), targets), np.asarray(expected)[targets])


def test_the_ngram_model_is_a_distribution_over_its_alphabet():
    train = np.random.default_rng(0).integers(0, 7, 400)
    model = NgramModel(4, alphabet=7).fit(train)
    for history in ([], [3], [1, 2, 3], [6, 6, 6, 6, 0], [5, 5, 5]):
        total = sum(2.0 ** -model.bits(np.array([*history, s]), np.array([len(history)]))[0] for s in range(7))
        assert total == pytest.approx(1.0, abs=1e-12)
    with pytest.raises(ValueError, match="symbols must lie"):
        model.bits(np.array([0, 7]))


def test_a_comparison_reads_its_verdict_off_the_bootstrap_interval():
    """Lower bits per byte is better: a variant 0.5 below the baseline on every block of every seed is `better`,
    one equal to it `within noise`; the exact permutation p of 3 vs 3 separated seeds is its minimum, 0.1."""
    rng = np.random.default_rng(0)

    def rows(shift: float) -> list[dict]:
        out = []
        for _ in range(3):
            bits = 2.0 + 0.3 * rng.standard_normal(40) + shift
            out.append({"test_bpb@8": float(bits.mean()), "test_bits@8": lm_study.encode_floats(bits)})
        return out

    baseline = rows(0.0)
    better = lm_study.compare(rows(-0.5), baseline, 8, level=0.99)
    assert better["verdict"] == "better" and better["ci"][1] < 0 and better["p"] == pytest.approx(0.1)
    worse = lm_study.compare(rows(+0.5), baseline, 8, level=0.99)
    assert worse["verdict"] == "worse" and worse["ci"][0] > 0
    same = lm_study.compare(baseline, baseline, 8, level=0.99)
    assert same["verdict"] == "within noise" and same["p"] == pytest.approx(1.0)


def test_the_headline_gives_each_variants_test_bits_and_its_verdict_against_the_baseline():
    spec = lm_study.LM
    summary = {
        "baseline": {"pick": 1e-3, **{f"test_bpb@{c}": [1.5, 1.7] for c in spec.eval_contexts}},
        "zpx_full": {"pick": 3e-4, **{f"test_bpb@{c}": [1.4, 1.4] for c in spec.eval_contexts}},
        "pct": {"pick": None},
    }
    results = {"zpx_full@256": {"diff": -0.2, "ci": (-0.3, -0.1), "verdict": "better"}}
    fp = {"bytes": 12_000_000}
    lines = lm_study.headline_markdown(spec, fp, summary, {}, results, {"3-gram": 2.5}, (10, 18))
    table = {line.split(" | ")[0].strip("| "): line for line in lines if line.startswith("| ") and " | " in line}
    assert "1.600 ± 0.141" in table["softmax + RoPE (baseline)"] and "(baseline)" in table["softmax + RoPE (baseline)"]
    zpx = table[lm_study.EVIDENCE_LABELS["zpx_full"]]
    assert "0.0003" in zpx and "1.400 ± 0.000" in zpx and "-0.200 [-0.300, -0.100] better" in zpx
    assert zpx.rstrip(" |").endswith("-")  # no comparison at 1024 yet
    assert "3-gram 2.500" in lines[-1] and "10 of 18 runs" in lines[-1]
