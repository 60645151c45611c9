"""Every client contract of `rmkit serve` under concurrency, and two faults, on loopback.

    python benchmarks/serve_contracts.py                 # MiniLM reward model, ~1 min on 2 CPU cores
    python benchmarks/serve_contracts.py --smoke         # a few requests per contract

For each contract (rmkit's native texts and conversations, vLLM classify / score / pooling, TEI predict,
OpenRLHF get_reward, the OpenAI embeddings route verl's SGLang branch reads) a real `python -m rmkit serve`
on a loopback port gets `--requests` requests from `--concurrency` threads (bounded: every loop has a
fixed count), each request 1-4 inputs; every answer's rewards are compared with the same inputs scored
one request at a time beforehand. Faults: (1) a client that gives up after 1 ms while others keep
sending must not poison the batch it was grouped with (the others' answers still equal the
single-request ones); (2) SIGTERM while requests are in flight: every request already accepted is
answered, and the server exits 0. Results: `benchmarks/results/serve_contracts.json`.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from benchmarks.serve_throughput import default_model_dir, make_requests  # noqa: E402
from rmkit.serve.process import ServerProcess  # noqa: E402


def _raw(body: dict | list, contract: str) -> list[float]:
    """The raw reward of each input from a contract's answer (activations turned off in the requests)."""
    if contract in ("texts", "conversations"):
        return body["rewards"]
    if contract == "get_reward":
        return body["rewards"]
    if contract == "classify":
        return [d["probs"][0] for d in body["data"]]
    if contract == "score":
        return [d["score"] for d in body["data"]]
    if contract in ("pooling", "embeddings"):
        return [d["data" if contract == "pooling" else "embedding"][0] for d in body["data"]]
    return [row[0]["score"] for row in body]  # TEI predict, a batch


def _request(contract: str, texts: list[str]) -> tuple[str, dict]:
    """`(path, body)` of one request for `texts` under a contract."""
    conversations = [[{"role": "user", "content": "Say something."}, {"role": "assistant", "content": t}]
                     for t in texts]
    return {
        "texts": ("/v1/score", {"texts": texts}),
        "conversations": ("/v1/score", {"conversations": conversations}),
        "classify": ("/classify", {"model": "rm", "input": texts, "use_activation": False}),
        "score": ("/score", {"model": "rm", "text_1": "", "text_2": texts, "use_activation": False}),
        "pooling": ("/pooling", {"model": "rm", "input": texts}),
        "predict": ("/predict", {"inputs": [[t] for t in texts], "raw_scores": True}),
        "get_reward": ("/get_reward", {"query": texts, "prompts": [""] * len(texts)}),
        "embeddings": ("/v1/embeddings", {"model": "rm", "input": texts}),
    }[contract]


CONTRACTS = ("texts", "conversations", "classify", "score", "pooling", "predict", "get_reward", "embeddings")


def run_contract(url: str, contract: str, requests: list[list[str]], concurrency: int) -> dict:
    """Single requests first (the reference), then all of them concurrently; errors and max |diff|."""
    with httpx.Client(base_url=url, timeout=120) as client:
        def send(texts):
            path, body = _request(contract, texts)
            response = client.post(path, json=body)
            return response.status_code, (_raw(response.json(), contract) if response.status_code == 200 else None)

        reference = [send(texts)[1] for texts in requests]
        start = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            answers = list(pool.map(send, requests))
        seconds = time.perf_counter() - start
    errors = sum(status != 200 for status, _ in answers)
    diffs = [abs(a - b) for (status, got), want in zip(answers, reference) if status == 200
             for a, b in zip(got, want)]
    return {"requests": len(requests), "errors": errors, "max_abs_diff": max(diffs) if diffs else None,
            "requests_per_s": len(requests) / seconds}


def client_timeout_fault(url: str, requests: list[list[str]]) -> dict:
    """Clients that give up after 1 ms, mixed with patient ones: the patient ones get the single-request
    rewards, and the server keeps answering."""
    with httpx.Client(base_url=url, timeout=120) as client:
        reference = [client.post("/v1/score", json={"texts": t}).json()["rewards"] for t in requests]

    def impatient(texts):
        try:
            httpx.post(url + "/v1/score", json={"texts": texts}, timeout=0.001)
        except httpx.TimeoutException:
            return "timed out"
        return "answered"

    with httpx.Client(base_url=url, timeout=120) as client, ThreadPoolExecutor(8) as pool:
        gave_up = [pool.submit(impatient, t) for t in requests]
        patient = list(pool.map(lambda t: client.post("/v1/score", json={"texts": t}).json()["rewards"], requests))
        outcomes = [f.result() for f in gave_up]
    diffs = [abs(a - b) for got, want in zip(patient, reference) for a, b in zip(got, want)]
    return {"impatient_requests": len(requests), "impatient_timed_out": outcomes.count("timed out"),
            "patient_requests": len(requests), "patient_max_abs_diff": max(diffs)}


def sigterm_fault(model_dir: Path, requests: list[list[str]]) -> dict:
    """SIGTERM once the server holds every request (a 2 s batch window keeps them waiting): all answered,
    exit status 0."""
    server = ServerProcess(model_dir, "--batch-window-ms", "2000").wait_ready()
    results: list[int] = []

    def send(texts):
        try:
            results.append(httpx.post(server.url + "/v1/score", json={"texts": texts}, timeout=60).status_code)
        except httpx.TransportError:
            results.append(-1)

    threads = [threading.Thread(target=send, args=(t,)) for t in requests]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    while _in_flight(server.url) < len(requests) and time.monotonic() < deadline:
        time.sleep(0.02)  # until the server holds every request (in its batch window)
    accepted = _in_flight(server.url)
    server.proc.send_signal(signal.SIGTERM)
    for thread in threads:
        thread.join()
    code = server.proc.wait(timeout=60)
    server.stop()
    return {"in_flight": accepted, "answered_200": results.count(200), "exit_status": code}


def _in_flight(url: str) -> int:
    """Requests the server is handling now, from its Prometheus gauge (the /metrics request itself is
    not counted: it is not a scoring route)."""
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("rmkit_requests_in_flight "):
            return int(float(line.split()[1]))
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="model directory (default: MiniLM with a fresh head)")
    parser.add_argument("--requests", type=int, default=48, help="requests per contract")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--smoke", action="store_true", help="6 requests per contract")
    parser.add_argument("--output", default=str(REPO_ROOT / "benchmarks/results/serve_contracts.json"))
    args = parser.parse_args()
    n = 6 if args.smoke else args.requests
    rng = random.Random(0)
    requests = [texts[: rng.randint(1, 4)] for texts in make_requests(n, 4, seed=1)]
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(args.model) if args.model else default_model_dir(Path(tmp))
        with ServerProcess(model_dir, "--max-inputs", "64") as server:
            contracts = {c: run_contract(server.url, c, requests, args.concurrency) for c in CONTRACTS}
            timeout = client_timeout_fault(server.url, requests[:8])
        drain = sigterm_fault(model_dir, requests[:8])
    result = {"machine": {"platform": platform.platform(), "python": platform.python_version()},
              "requests_per_contract": n, "concurrency": args.concurrency, "contracts": contracts,
              "client_timeout": timeout, "sigterm": drain}
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    ok = (all(c["errors"] == 0 and c["max_abs_diff"] <= 1e-5 for c in contracts.values())
          and timeout["patient_max_abs_diff"] <= 1e-5 and drain["answered_200"] == drain["in_flight"] == 8
          and drain["exit_status"] == 0)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
