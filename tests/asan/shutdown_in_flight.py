#!/usr/bin/env python3
"""SIGTERM with work in flight, under AddressSanitizer (docs/reliability.md, "Shutdown").

Starts swarm-server (built with -fsanitize=address), trains one policy step, then keeps
agents streaming and calling the model while the server gets SIGTERM. Passes when the server
exits 0, AddressSanitizer reported nothing, and the stop-time checkpoint of step 1 was
written. Standard library only.

Usage: shutdown_in_flight.py --server BIN --engine mock|torch [--model-bin swarm-model]
"""
import argparse
import http.client
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time


def fail(msg, log=None):
    print(f"FAIL: {msg}", file=sys.stderr)
    if log and log.exists():
        print("--- server log (tail)", file=sys.stderr)
        print("\n".join(log.read_text(errors="replace").splitlines()[-60:]), file=sys.stderr)
    sys.exit(1)


def request(port, method, path, body=None, headers=None, timeout=30):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        h = {"content-type": "application/json"}
        h.update(headers or {})
        conn.request(method, path, body=data, headers=h)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def post(port, path, body, headers=None, expect=200):
    status, data = request(port, "POST", path, body, headers)
    if status != expect:
        raise RuntimeError(f"{path}: HTTP {status}: {data[:300]!r}")
    return json.loads(data) if data else {}


def engine_status(port):
    status, data = request(port, "GET", "/get_engine_status", timeout=5)
    return json.loads(data) if status == 200 else {}


def claim(port, client):
    r = post(port, "/claim_episode", {"client_uuid": client, "episode_type": "train", "discard_episode_timeout": 600})
    if not r.get("success"):
        raise RuntimeError(f"claim refused: {r}")
    return r


def chat(port, episode, stream, max_tokens):
    body = {"model": "m", "messages": [{"role": "user", "content": "tell a long story"}],
            "max_tokens": max_tokens, "stream": stream}
    base = "/v1"
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", base + "/chat/completions", body=json.dumps(body).encode(),
                     headers={"content-type": "application/json", "authorization": "Bearer " + episode["openai_api_key"]})
        r = conn.getresponse()
        while r.read(64):  # slowly, as a client reading a stream
            pass
        return r.status
    finally:
        conn.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--engine", choices=["mock", "torch"], required=True)
    ap.add_argument("--model-bin")
    args = ap.parse_args()

    work = pathlib.Path(tempfile.mkdtemp(prefix=f"asan-shutdown-{args.engine}-"))
    log = work / "server.log"
    try:
        if args.engine == "torch":
            if not args.model_bin:
                fail("--model-bin is needed for the torch engine")
            subprocess.run([args.model_bin, "init", "--preset", "tiny-char", "--out", str(work / "model"), "--seed", "1"],
                           check=True, stdout=subprocess.DEVNULL)
            model, max_tokens = str(work / "model"), 96
        else:
            model, max_tokens = "mock-model", 16
        (work / "job.yaml").write_text(
            f"model: {model}\nexperiment_dir: {work / 'exp'}\nbatch_size: 1\nnum_repeat: 2\n"
            f"max_parallel_episodes: 16\nmax_response_length: {max_tokens}\nsave_freq: 1000\nseed: 1\n"
            + ("mock_train_seconds: 0.2\n" if args.engine == "mock" else ""))
        env = dict(os.environ)
        env["ASAN_OPTIONS"] = "detect_leaks=0:detect_container_overflow=0:exitcode=23:" + env.get("ASAN_OPTIONS", "")
        with open(log, "wb") as out:
            server = subprocess.Popen([args.server, "start", "--port", "0", "--engine", args.engine, "--config",
                                       str(work / "job.yaml"), "--log-level", "info"], stdout=out, stderr=out, env=env)
        port = None
        for _ in range(1200):
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", log.read_text(errors="replace"))
            if m:
                port = int(m.group(1))
                break
            if server.poll() is not None:
                fail("the server exited while starting", log)
            time.sleep(0.1)
        if port is None:
            fail("the server never reported its port", log)
        post(port, "/start_engine", {})
        for _ in range(1200):
            if engine_status(port).get("engine_status") == "ENGINE.ROLLING":
                break
            time.sleep(0.1)
        else:
            fail("the engine never reached ROLLING", log)

        # Step 1: two episodes of one task, different rewards.
        for reward in (0.0, 1.0):
            ep = claim(port, "trainer")
            if chat(port, ep, False, max_tokens) != 200:
                fail("a chat call of step 1 failed", log)
            post(port, "/end_episode", {"client_uuid": "trainer", "episode_uuid": ep["episode_uuid"], "task_id": "t0",
                                        "workflow_output": {"reward": reward, "metadata": {}}})
        for _ in range(1200):
            if engine_status(port).get("global_step", 0) >= 1:
                break
            time.sleep(0.1)
        else:
            fail("step 1 was never trained", log)

        # Agents that call the model until the server goes: streams and plain calls in flight.
        stop = threading.Event()
        calls = [0] * 6

        def agent(i):
            try:
                ep = claim(port, f"agent-{i}")
                while not stop.is_set():
                    chat(port, ep, i % 2 == 0, max_tokens)
                    calls[i] += 1
            except Exception:
                pass  # the server closed the connection as it stopped

        threads = [threading.Thread(target=agent, args=(i,), daemon=True) for i in range(len(calls))]
        for t in threads:
            t.start()
        deadline = time.time() + 120
        while min(calls) < 1 and time.time() < deadline and server.poll() is None:
            time.sleep(0.05)
        if min(calls) < 1:
            fail(f"the agents did not get answers before the SIGTERM (calls {calls})", log)
        time.sleep(0.3)
        server.send_signal(signal.SIGTERM)
        try:
            rc = server.wait(timeout=180)
        except subprocess.TimeoutExpired:
            server.kill()
            fail("the server did not exit within 180 s of SIGTERM", log)
        stop.set()
        text = log.read_text(errors="replace")
        if "AddressSanitizer" in text or "runtime error:" in text:
            fail("AddressSanitizer reported an error", log)
        if rc != 0:
            fail(f"the server exited {rc} after SIGTERM", log)
        steps = sorted(str(p.relative_to(work)) for p in (work / "exp").rglob("checkpoints/step-1"))
        if not steps or "checkpoint of step 1 written" not in text:
            fail("the stop-time checkpoint of step 1 was not written", log)
        print(f"ok ({args.engine}): SIGTERM with {len(calls)} agents calling the model ({sum(calls)} calls answered) "
              f"exited 0, AddressSanitizer clean, {steps[0]} written at stop")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
