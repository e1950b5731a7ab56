"""What a foreign trainer needs besides its code, generated here and never downloaded: a
Hugging Face ``tokenizer.json`` folder (a byte-level BPE trained with the ``tokenizers``
package on the generated text) and a JSONL dataset of ``{"text": ...}`` lines (seeded
pseudo-words), as torchtitan 0.2.x reads them (``--model.hf_assets_path``,
``--training.dataset c4_test --training.dataset_path``). Also the study of a torchtitan sweep
on CPU processes through ``tests/titan_cpu.py`` (shared by tests/integration/test_foreign.py and
``benchmarks/foreign.py``)."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TITAN_CPU = ROOT / "tests" / "titan_cpu.py"
#: torchtitan's llama3 ``debugmodel`` flavour (torchtitan/models/llama3/__init__.py, v0.2.2):
#: the shape the sweep trains, declared to scalestudy as the same model.
DEBUGMODEL = {"arch": "llama", "layers": 6, "hidden": 256, "heads": 16, "vocab": 2048,
              "multiple_of": 256, "rope_theta": 500000}
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"


def text_lines(n: int = 300, seed: int = 0) -> list[str]:
    """``n`` lines of seeded pseudo-words (syllables), 40 to 120 words each."""
    rng = random.Random(seed)
    syll = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    words = ["".join(rng.choice(syll) for _ in range(rng.randint(1, 3))) for _ in range(600)]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(40, 120))) + "."
            for _ in range(n)]


def write_assets(root: str | Path, vocab: int = 512) -> tuple[Path, Path]:
    """``(tokenizer_dir, dataset_dir)`` under ``root``: ``tokenizer.json`` (+
    ``tokenizer_config.json`` naming BOS/EOS) and ``dataset/train.jsonl``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    root = Path(root)
    lines = text_lines()
    data = root / "dataset"
    data.mkdir(parents=True, exist_ok=True)
    (data / "train.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in lines))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(lines, trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tdir = root / "tokenizer"
    tdir.mkdir(exist_ok=True)
    tok.save(str(tdir / "tokenizer.json"))
    (tdir / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": BOS, "eos_token": EOS, "add_bos_token": True, "add_eos_token": True}))
    return tdir, data


#: Where torchtitan's own profiler writes a rank's trace under its dump folder
#: (``--profiling.save_traces_folder``, one folder per profiled iteration), relative to the
#: run folder: a command workload's ``traces``.
TITAN_TRACES = "torchtitan/profile_traces/iteration_*/rank*_trace.json"


def titan_command(tokenizer: Path, dataset: Path, python: str = "{python}",
                  profile: bool = False) -> list[str]:
    """The argv template of torchtitan 0.2.2 on CPU processes: the point's steps, batch,
    sequence length and FSDP degree; fp32 parameters (bf16 matmul is slow on CPUs without
    AVX512-BF16); one log line per step; no checkpoint. ``profile``: torchtitan's own
    profiler traces its last step (``--profiling.*``: written under :data:`TITAN_TRACES`)."""
    traced = (["--profiling.enable_profiling", "--profiling.profile_freq", "{steps}",
               "--profiling.profiler_warmup", "1", "--profiling.profiler_active", "1"]
              if profile else [])
    return [python, str(TITAN_CPU), *traced,
            "--model.name", "llama3", "--model.flavor", "debugmodel",
            "--model.hf_assets_path", str(tokenizer),
            "--training.dataset", "c4_test", "--training.dataset_path", str(dataset),
            "--training.steps", "{steps}", "--training.seq_len", "{seq_len}",
            "--training.local_batch_size", "{micro_batch}",
            "--training.global_batch_size", "{global_batch}",
            "--training.mixed_precision_param", "float32",
            "--parallelism.data_parallel_shard_degree", "{dp}",
            "--lr_scheduler.warmup_steps", "1",
            "--metrics.log_freq", "1", "--job.dump_folder", "{point_dir}/torchtitan"]


if __name__ == "__main__":  # python tests/foreign_assets.py DIR
    print(*write_assets(sys.argv[1]))
