"""rmkit against TRL on one device, every recipe side by side in one run, in sections, most important first.

    setup       the backbones, the device, and a big matmul in bf16 and fp32 (the measured peaks)
    profile     configs/rm.yaml's reward-model step in fp32 and bf16 under torch.profiler (rm_profile.py; or in the
                precisions and with the overrides `--profile-precision` and `--profile-override` give)
    rm_minilm   reward model, MiniLM: TRL's RewardTrainer vs `rmkit train`, bf16 (train_vs_trl.py), then rmkit with
                compiled blocks (`policy.compile`, with and without CUDA graphs, the blocks one region each or all
                one) and TRL with `torch_compile`
    dpo         DPO of SmolLM2-135M, bf16 (dpo_vs_trl.py)
    sft         SFT of SmolLM2-135M, bf16: TRL, rmkit, rmkit packed (sft_vs_trl.py)
    rm_smollm2  reward model, the SmolLM2-135M decoder, bf16 (train_vs_trl.py --workload smollm2), and rmkit's
                compiled variants
    grpo        GRPO of SmolLM2-135M against a MiniLM reward model, bf16 (grpo_vs_trl.py)
    score       scoring throughput against transformers' pipeline, bf16 (score_throughput.py)

Each section runs its benchmark script's own `main` with `--device` (both sides on the same device, same data,
hyperparameters and precision; the first epoch, or step for GRPO, is warmup and untimed) and merges into
`--output` the numbers that compare, MFU and the script's whole results under `raw`, so a later section that
fails or times out loses nothing before it. MFU is model FLOPs (6 x matmul parameters x tokens for training,
2 x for scoring) per second over the measured bf16 matmul (`setup`) and over the card's dense bf16 spec
(`--peak-tflops`, else from its name: H100 SXM / H200 989, H100 PCIe 756). GRPO gets none: its time is
generation, a memory-bound decode.

`--weights random` (the default) builds MiniLM and SmolLM2-135M at their real architecture from their config
files, with seeded random weights: a lent GPU machine cannot receive the weights (64 MiB per transfer), and
throughput, MFU and memory do not depend on them, but held-out accuracy and reward are then NOT meaningful
(reported only as a check that both sides ran). `--tiny` shrinks both to 2 layers of width 64 and every
section to a few steps: the CPU test and dry run. `--weights real` trains the packaged weights.

    python benchmarks/device_suite.py --device cuda --section setup,profile,rm_minilm --output /tmp/results.json
    bash scripts/gpu_check/bench.sh          # on the GPU machine, one section per process, each under a timeout
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks import common  # noqa: E402

SECTIONS = ("setup", "profile", "rm_minilm", "dpo", "sft", "rm_smollm2", "grpo", "score")
SPEC_BF16_TFLOPS = {"H100 PCIe": 756.0, "H100": 989.4, "H200": 989.4}  # dense, no sparsity; first match wins
TINY = {"bert": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 128},
        "llama": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                  "head_dim": 16, "intermediate_size": 128}}
DEFAULT_SMOLLM2_CONFIG = common.REPO_ROOT / ".devcheck" / "bench" / "smollm2_config.json"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    parser.add_argument("--section", default=",".join(SECTIONS), help=f"comma list of {', '.join(SECTIONS)}")
    parser.add_argument("--weights", choices=["random", "real"], default="random")
    parser.add_argument("--tiny", action="store_true", help="2-layer width-64 backbones, a few steps per section")
    parser.add_argument("--threads", type=int, default=8, help="torch threads per process, both sides")
    parser.add_argument("--peak-tflops", type=float, help="the card's dense bf16 peak (default: from its name)")
    parser.add_argument("--smollm2-config", type=Path, help=f"SmolLM2's config.json (default: {DEFAULT_SMOLLM2_CONFIG} "
                        "if present, else read from the packaged GGUF)")
    parser.add_argument("--variants", default=",".join(COMPILED),
                        help=f"the reward-model sections' compiled runs, comma list of {', '.join(COMPILED)} ('' = none)")
    parser.add_argument("--profile-precision", default="fp32,bf16", help="the profile section's precisions")
    parser.add_argument("--profile-override", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override of the profiled step (repeatable), e.g. policy.compile=true")
    parser.add_argument("--profile-warmup-steps", type=int, default=3,
                        help="steps before the profile's timed ones (compiled blocks record their shapes in these)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--record-timeout", metavar="SECTION:SECONDS",
                        help="only note in --output that SECTION was stopped after SECONDS (bench.sh's timeout)")
    parser.add_argument("--data-dir", type=Path, default=common.DEFAULT_DATA_DIR)
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/rmkit-device-suite"))
    parser.add_argument("--output", type=Path, default=Path("/tmp/rmkit-device-suite/results.json"))
    args = parser.parse_args(argv)
    args.section = [s for s in args.section.split(",") if s]
    if not set(args.section) <= set(SECTIONS):
        parser.error(f"--section takes {', '.join(SECTIONS)}")
    args.variants = [v for v in args.variants.split(",") if v]
    if not set(args.variants) <= set(COMPILED):
        parser.error(f"--variants takes {', '.join(COMPILED)}")
    if args.weights == "real" and args.tiny:
        parser.error("--tiny builds its own small backbones: use it with --weights random")
    return args


# ---------------------------------------------------------------- backbones


def random_backbone(kind: str, args: argparse.Namespace) -> Path:
    """`kind` (minilm: a BERT encoder; smollm2: a Llama causal LM) at its real architecture (or `--tiny`), with
    weights drawn from `--seed`, saved with its tokenizer under the work directory; reused while its stamp holds."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    from rmkit.models.reward import load_tokenizer
    from rmkit.models.setup import resolve_model_name

    destination = args.work_dir / "models" / kind
    stamp = f"{kind} seed={args.seed} tiny={args.tiny}"
    if (destination / "BUILT").is_file() and (destination / "BUILT").read_text() == stamp:
        return destination
    source = resolve_model_name(kind)
    tokenizer = load_tokenizer(source)
    config = AutoConfig.from_pretrained(source) if kind == "minilm" else smollm2_config(args)
    for key, value in (TINY["bert" if kind == "minilm" else "llama"] if args.tiny else {}).items():
        setattr(config, key, value)
    config.pad_token_id = tokenizer.pad_token_id
    torch.manual_seed(args.seed)
    model = (AutoModel if kind == "minilm" else AutoModelForCausalLM).from_config(config)
    if kind == "smollm2":
        model.generation_config.eos_token_id = tokenizer.eos_token_id  # both trainers stop on the same token
    model.save_pretrained(destination)
    tokenizer.save_pretrained(destination)
    (destination / "BUILT").write_text(stamp)
    return destination


def smollm2_config(args: argparse.Namespace):
    """SmolLM2-135M's `LlamaConfig`: from `--smollm2-config`, .devcheck's copy, or the packaged GGUF's header."""
    from transformers import AutoConfig, LlamaConfig

    from rmkit.models.setup import resolve_model_name

    path = args.smollm2_config or (DEFAULT_SMOLLM2_CONFIG if DEFAULT_SMOLLM2_CONFIG.is_file() else None)
    if path is not None:
        return LlamaConfig.from_json_file(path)
    directory = Path(resolve_model_name("smollm2"))
    return AutoConfig.from_pretrained(directory, gguf_file=next(directory.glob("*.gguf")).name)


def backbones(args: argparse.Namespace) -> dict:
    """Directories (or names) of the two backbones every section trains."""
    if args.weights == "real":
        return {"minilm": str(common.minilm_path()), "smollm2": "smollm2", "smollm2_backbone": str(common.smollm2_path())}
    minilm, smollm2 = random_backbone("minilm", args), random_backbone("smollm2", args)
    return {"minilm": str(minilm), "smollm2": str(smollm2), "smollm2_backbone": str(smollm2)}


def matmul_params(directory: str) -> int:
    """Parameters a token multiplies: the non-embedding ones plus an output layer tied to the embeddings (a
    causal LM's LM head), counted on the meta device from the config alone."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from rmkit.models.setup import resolve_model_name

    directory = resolve_model_name(directory)
    gguf = next(Path(directory).glob("*.gguf"), None)
    config = AutoConfig.from_pretrained(directory, **({"gguf_file": gguf.name} if gguf else {}))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    head = model.get_output_embeddings().weight
    tied = head is model.get_input_embeddings().weight
    return common.non_embedding_params(model) + (head.numel() if tied else 0)


# ---------------------------------------------------------------- sections


def section_setup(args, results: dict) -> dict:
    models = backbones(args)
    on_gpu = {"size": 8192, "device": "cuda"} if args.device == "cuda" else {}
    peaks = {p: common.matmul_peak_flops(dtype, args.threads, **on_gpu)
             for p, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32))}
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    spec = args.peak_tflops or next((v for k, v in SPEC_BF16_TFLOPS.items() if k in name), None)
    # A lent machine gets TRL from carried wheels; where it does not import, the sections that can still run
    # rmkit alone (reward models, GRPO) do, and say so.
    trl = subprocess.run([sys.executable, "-c", "import trl, datasets"], capture_output=True, text=True)
    return {"device_name": name, "trl_import_error": trl.stderr[-2000:] if trl.returncode else None,
            "models": models, "smollm2_matmul_params": matmul_params(models["smollm2"]),
            "matmul_peak_flops": peaks, "spec_bf16_peak_flops": spec * 1e12 if spec else None,
            "weights": "tiny random" if args.tiny else args.weights,
            "accuracy_meaningful": args.weights == "real", "machine": common.machine_info(),
            "gpu_memory_total_mib": torch.cuda.get_device_properties(0).total_memory / 2**20 if on_gpu else None}


def mfu(flops_per_s: float, setup: dict) -> dict:
    """Model FLOPs per second over the measured bf16 matmul and over the card's spec."""
    spec = setup["spec_bf16_peak_flops"]
    return {"vs_measured_bf16_matmul": flops_per_s / setup["matmul_peak_flops"]["bf16"],
            "vs_spec_bf16": flops_per_s / spec if spec else None}


def common_args(args, name: str) -> list[str]:
    return ["--device", args.device, "--threads", str(args.threads), "--work-dir", str(args.work_dir / name),
            "--output", str(args.work_dir / f"{name}.json")]


def section_profile(args, results: dict) -> dict:
    from benchmarks import rm_profile

    steps = (["--warmup-steps", "1", "--timed-steps", "2", "--active-steps", "1"] if args.tiny
             else ["--warmup-steps", str(args.profile_warmup_steps)])
    argv = [*common_args(args, "profile"), "--backbone", results["setup"]["models"]["minilm"], *steps,
            "--data-dir", str(args.data_dir), "--precision", args.profile_precision,
            *(f"--override={o}" for o in args.profile_override)]
    status = rm_profile.main(argv)
    raw = json.loads((args.work_dir / "profile.json").read_text())
    (args.output.parent / "rm_profile.txt").write_text((args.work_dir / "profile.txt").read_text())
    return {"status": status, "summary": {p: {k: v for k, v in r.items() if not k.startswith("top")}
                                          for p, r in raw["results"].items()},
            "bf16_over_fp32": raw.get("bf16_over_fp32"), "raw": raw}


# rmkit's compiled reward-model step (`policy.compile`), each variant one more rmkit run after the plain pair, and
# TRL's own `torch_compile`: name -> train_vs_trl.py arguments.
COMPILED = {
    "rmkit_compiled_stack_cuda_graphs": ["--sides", "rmkit", "--rmkit-override", "policy.compile=true",
                                         "--rmkit-override", "policy.compile_mode=reduce-overhead",
                                         "--rmkit-override", "policy.compile_scope=stack"],
    "rmkit_compiled_cuda_graphs": ["--sides", "rmkit", "--rmkit-override", "policy.compile=true",
                                   "--rmkit-override", "policy.compile_mode=reduce-overhead"],
    "rmkit_compiled": ["--sides", "rmkit", "--rmkit-override", "policy.compile=true"],
    "rmkit_compiled_stack": ["--sides", "rmkit", "--rmkit-override", "policy.compile=true",
                             "--rmkit-override", "policy.compile_scope=stack"],
    "trl_compiled": ["--sides", "trl", "--trl-compile"],
}


def train_rm(args, results: dict, name: str, workload: str, precision: str, variants=()) -> dict:
    """TRL against rmkit on one reward-model workload, then each of `variants` (`COMPILED`'s names) in bf16, its
    pairs/s over the plain TRL run's."""
    from benchmarks import train_vs_trl

    setup = results["setup"]
    backbone = setup["models"]["minilm" if workload == "minilm" else "smollm2_backbone"]
    size = {"minilm": ("1504", "256"), "smollm2": ("256", "64")}[workload]
    pairs, eval_pairs = ("16", "8") if args.tiny else size
    base = [*common_args(args, name), "--workload", workload, "--backbone", backbone, "--pairs", pairs,
            "--eval-pairs", eval_pairs, "--eval-files", "hh_harmless_val.jsonl", "--batch-size", "8" if args.tiny else "16",
            "--warmup-epochs", "1", "--data-dir", str(args.data_dir)]
    status = train_vs_trl.main([*base, "--precision", precision,
                                *(["--sides", "rmkit"] if setup.get("trl_import_error") else [])])
    raw = json.loads((args.work_dir / f"{name}.json").read_text())
    params = raw["workload"]["non_embedding_params"]

    def numbers(r: dict) -> dict:
        return {**{k: r.get(k) for k in ("pairs_per_s", "real_tokens_per_s", "embedded_per_real", "peak_gpu_mib",
                                         "train_s", "accuracy/hh_harmless_val.jsonl")},
                "mfu_vs_same_precision_matmul": r["mfu"], "mfu": mfu(6 * params * r["real_tokens_per_s"], setup)}

    summary = {}
    for prec, row in raw["summary"].items():
        summary[prec] = {"ratio_rmkit_over_trl": row.get("ratio_rmkit_over_trl")}
        summary[prec].update({side: numbers(row[side]) for side in ("trl", "rmkit") if side in row})
    out = {"status": status, "summary": summary, "raw": raw, "variants": {}}
    trl = summary.get("bf16", {}).get("trl", {}).get("pairs_per_s")
    for variant in (v for v in variants if v in args.variants):
        if variant.startswith("trl") and setup.get("trl_import_error"):
            continue
        argv = [*base, "--precision", "bf16", *COMPILED[variant], "--output", str(args.work_dir / f"{name}_{variant}.json")]
        try:
            variant_status = train_vs_trl.main(argv)
            row = json.loads((args.work_dir / f"{name}_{variant}.json").read_text())["summary"]["bf16"]
            got = numbers(next(iter(row.values())))
            out["variants"][variant] = {"status": variant_status, **got,
                                        "pairs_per_s_over_trl": got["pairs_per_s"] / trl if trl else None}
        except BaseException as error:  # one variant failing (a compile error) leaves the others
            if isinstance(error, KeyboardInterrupt):
                raise
            out["variants"][variant] = {"error": f"{type(error).__name__}: {error}"[-3000:],
                                        "traceback": traceback.format_exc()[-3000:]}
        print(f"{name} {variant}: {json.dumps(out['variants'][variant])[:400]}", flush=True)
        # Kept as it comes: a section stopped by its time limit (bench.sh) keeps the variants it finished.
        common.write_json(args.output, {**json.loads(args.output.read_text()), name: {**out, "partial": True}})
    return out


def section_rm_minilm(args, results):
    return train_rm(args, results, "rm_minilm", "minilm", "bf16", COMPILED)


def section_rm_smollm2(args, results):
    variants = ("rmkit_compiled_stack_cuda_graphs", "rmkit_compiled_cuda_graphs", "rmkit_compiled", "rmkit_compiled_stack")
    return train_rm(args, results, "rm_smollm2", "smollm2", "bf16", variants)


def section_dpo(args, results: dict) -> dict:
    from benchmarks import dpo_vs_trl

    setup = results["setup"]
    sizes = ["--pairs", "8", "--eval-pairs", "4", "--batch", "4", "--micro", "2", "--max-length", "128"] if args.tiny \
        else ["--pairs", "64", "--eval-pairs", "32", "--batch", "8", "--micro", "4"]
    argv = [*common_args(args, "dpo"), "--policy", setup["models"]["smollm2"], *sizes, "--precision", "bf16",
            "--warmup-epochs", "1", "--repeats", "1", "--data-dir", str(args.data_dir)]
    status = dpo_vs_trl.main(argv)
    raw = json.loads((args.work_dir / "dpo.json").read_text())
    tokens = raw["data"]["unshared_row_tokens"]  # one epoch as 2N unshared rows: the workload's model FLOPs
    summary = {side: {**{k: m.get(k) for k in ("steady_training_pairs_per_s", "pairs_per_s", "reference_s",
                                                "steady_training_s", "peak_gpu_mib")},
                      "held_out_accuracy": raw["held_out"].get(side, {}).get("accuracy"),
                      "training_mfu": mfu(6 * setup["smollm2_matmul_params"] * tokens / m["steady_training_s"], setup)}
               for side, m in raw["median"].items()}
    ratio = {k: summary["rmkit"][k] / summary["trl"][k] for k in ("steady_training_pairs_per_s", "pairs_per_s")} \
        if set(summary) == {"trl", "rmkit"} else None
    return {"status": status, "summary": summary, "ratio_rmkit_over_trl": ratio, "checks": raw["checks"], "raw": raw}


def section_sft(args, results: dict) -> dict:
    from benchmarks import sft_vs_trl

    setup = results["setup"]
    argv = [*common_args(args, "sft"), "--policy", setup["models"]["smollm2"], "--sequences", "16" if args.tiny else "128",
            "--precision", "bf16", "--warmup-epochs", "1", "--data-dir", str(args.data_dir)]
    status = sft_vs_trl.main(argv)
    raw = json.loads((args.work_dir / "sft.json").read_text())
    summary = {r["run"]: {"tokens_per_s": r["tokens_per_s"], "train_s": r["train_s"], "peak_gpu_mib": r.get("peak_gpu_mib"),
                          "mfu": mfu(6 * setup["smollm2_matmul_params"] * r["tokens_per_s"], setup)} for r in raw["runs"]}
    trl = summary.get("trl-0", {}).get("tokens_per_s")
    ratio = {run: s["tokens_per_s"] / trl for run, s in summary.items() if trl and run != "trl-0"}
    return {"status": status, "summary": summary, "ratio_over_trl": ratio, "raw": raw}


def section_grpo(args, results: dict) -> dict:
    from benchmarks import grpo_vs_trl

    setup = results["setup"]
    reward_model = common.export_reward_model(setup["models"]["minilm"], args.work_dir / "grpo_reward_model", args.seed)
    sizes = ["--prompts", "2", "--generations", "2", "--steps", "2", "--max-new-tokens", "4", "--eval-prompts", "2"] \
        if args.tiny else ["--prompts", "8", "--generations", "4", "--steps", "4", "--max-new-tokens", "48",
                           "--eval-prompts", "16"]
    argv = [*common_args(args, "grpo"), "--policy", setup["models"]["smollm2"], "--reward-model", str(reward_model),
            *sizes, "--precision", "bf16", "--warmup-steps", "1", "--data-dir", str(args.data_dir),
            *(["--sides", "rmkit"] if setup.get("trl_import_error") else [])]
    status = grpo_vs_trl.main(argv)
    raw = json.loads((args.work_dir / "grpo.json").read_text())
    summary = {r["side"]: {"seconds_per_step": r["seconds_per_step"], "generated_tokens_per_s": r["generated_tokens_per_s"],
                           "peak_gpu_mib": r.get("peak_gpu_mib"),
                           "held_out_reward": raw["held_out_reward"].get(r["side"], {}).get("mean")} for r in raw["runs"]}
    return {"status": status, "summary": summary, "ratio_trl_over_rmkit": raw.get("ratio_trl_over_rmkit"),
            "held_out_reward_initial": raw["held_out_reward"].get("initial", {}).get("mean"), "raw": raw}


def section_score(args, results: dict) -> dict:
    from benchmarks import score_throughput

    setup = results["setup"]
    model = common.export_reward_model(setup["models"]["minilm"], args.work_dir / "score_model", args.seed)
    sizes = ["--pairs", "8", "--batch-sizes", "1,4", "--repeats", "1"] if args.tiny else \
        ["--pairs", "256", "--batch-sizes", "1,64", "--repeats", "2"]
    argv = ["--device", args.device, "--threads", str(args.threads), "--model", str(model), "--precision", "bf16",
            "--data", str(common.data_file(args.data_dir, "hh_harmless_val.jsonl")), *sizes,
            "--output", str(args.work_dir / "score.json")]
    status = score_throughput.main(argv)
    raw = json.loads((args.work_dir / "score.json").read_text())
    summary = {name: {**value, "mfu": mfu(value["mfu"] * raw["matmul_peak_flops"], setup)}
               for name, value in raw["results"].items() if isinstance(value, dict)}
    return {"status": status, "summary": summary,
            "ratio_rmkit_over_best_pipeline": raw["results"]["ratio_rmkit_over_best_pipeline"], "raw": raw}


RUNNERS = {name: globals()[f"section_{name}"] for name in SECTIONS}


def run_section(args, name: str) -> bool:
    """Run one section and merge what it returns, or its error, into `--output`; True when it succeeded."""
    results = json.loads(args.output.read_text()) if args.output.is_file() else {}
    if name != "setup" and "setup" not in results:  # a section run alone: set up first, and keep it
        run_section(args, "setup")
        results = json.loads(args.output.read_text())
    start = time.perf_counter()
    try:
        entry, ok = RUNNERS[name](args, results), True
    except BaseException as error:  # SystemExit from a script included: record it, let the next section run
        if isinstance(error, KeyboardInterrupt):
            raise
        entry, ok = {"error": f"{type(error).__name__}: {error}"[-4000:], "traceback": traceback.format_exc()[-4000:]}, False
    entry["section_s"] = time.perf_counter() - start
    if args.device == "cuda":
        torch.cuda.empty_cache()
    results[name] = entry
    results["sections_done"] = [s for s in SECTIONS if s in results and "error" not in results[s]]
    common.write_json(args.output, results)
    print(f"section {name}: {'ok' if ok else entry['error'][:300]} ({entry['section_s']:.1f} s)", flush=True)
    return ok


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    if args.record_timeout:
        name, seconds = args.record_timeout.split(":")
        results = json.loads(args.output.read_text()) if args.output.is_file() else {}
        results[name] = {**results.get(name, {}), "error": f"timeout: stopped after {seconds} s"}  # what it kept
        common.write_json(args.output, results)
        return 0
    failed = [name for name in args.section if not run_section(args, name)]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
