#!/usr/bin/env python3
"""python_agent: a swarm agent speaking the raw HTTP protocol, standard library only.

For Python users who do not use AgentJet's client; docs/protocol.md has every field.

  1. GET  /get_engine_status    engine_status (ENGINE.OFFLINE, BOOTING, ROLLING, ...), global_step
  2. POST /sync_train_config    {yaml_as_string}: the job; only while OFFLINE
     POST /start_engine         returns at once: poll the status until ENGINE.ROLLING
  3. POST /claim_episode        {client_uuid, episode_type, discard_episode_timeout}
                                -> {success, episode_uuid, openai_base_url, openai_api_key}
                                success false + fail_cause is "not now" (batch full, syncing): retry
  4. POST <openai_base_url>/chat/completions, "Authorization: Bearer <openai_api_key>"
  5. POST /end_episode          {client_uuid, episode_uuid, task_id, workflow_output}
     POST /abort_episode        {client_uuid, episode_uuid} instead when the episode went wrong

The task: reverse a word; the reward is how close the answer comes (difflib ratio, in [0, 1]).
Episodes sharing a task_id form one GRPO group of num_repeat episodes.

  swarm-server start --engine mock &
  python3 examples/python_agent/agent.py --steps 3 --workers 4
"""
import argparse
import collections
import concurrent.futures
import difflib
import http.client
import json
import os
import random
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid

WORDS = ["apple", "river", "level", "lantern", "violet", "radar", "harbor", "pepper",
         "glacier", "rotor", "meadow", "copper", "falcon", "kayak", "orchid", "willow"]
RETRY_STATUS = (429, 503)  # "busy, come back later"; any other error status is final


class AgentError(Exception):
    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status  # the HTTP status when the server answered, else None


def request(method, url, body=None, token=None, retry_seconds=60.0):
    """One JSON request; retries connection errors and 429/503 with capped, jittered backoff."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = "Bearer " + token
    deadline, delay = time.monotonic() + retry_seconds, 0.2
    while True:
        try:
            req = urllib.request.Request(url, data=data, headers=headers, method=method)
            with urllib.request.urlopen(req, timeout=120) as resp:
                return json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as e:  # caught before OSError: it is one
            text = e.read().decode(errors="replace")
            try:
                text = json.loads(text)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                pass  # not the server's JSON error shape: show the body as it came
            if e.code not in RETRY_STATUS or time.monotonic() > deadline:
                raise AgentError(f"{method} {url}: HTTP {e.code}: {text.strip()[:500]}", e.code)
        except json.JSONDecodeError as e:
            raise AgentError(f"{method} {url}: the answer is not JSON: {e}")
        except (OSError, http.client.HTTPException) as e:  # refused, reset, timed out
            if time.monotonic() > deadline:
                raise AgentError(f"cannot reach the swarm server at {url}: {getattr(e, 'reason', e)} "
                                 f"(retried for {retry_seconds:g} s)")
        # Jitter keeps many workers from retrying in lockstep after a server restart.
        time.sleep(delay * random.uniform(0.5, 1.0))
        delay = min(delay * 2, 5.0)


def score(word, reply):
    """The reply's last word against the reversed word: 1.0 when exact, partial credit otherwise."""
    words = reply.split()
    answer = words[-1].strip(".,!?'\"").lower() if words else ""
    return difflib.SequenceMatcher(None, answer, word[::-1]).ratio()


class Agent:
    def __init__(self, args):
        self.args, self.url = args, args.server.rstrip("/")
        self.client_uuid = str(uuid.uuid4())  # one identity: only the claiming client may end
        self.stop, self.lock = threading.Event(), threading.Lock()
        self.rewards = collections.defaultdict(list)  # policy_version that answered -> rewards
        self.pending, self.groups = [], 0
        self.num_repeat, self.fatal, self.last_fail_cause = 1, None, None

    def call(self, path, body=None, token=None):
        return request("GET" if body is None else "POST", self.url + path, body, token,
                       self.args.retry_seconds)

    def episode_call(self, path, body):
        return self.call(path, {"client_uuid": self.client_uuid, **body},
                         self.args.client_token or self.args.admin_token)

    def next_task(self):
        # Each task goes out num_repeat times: a group only counts once that many episodes end.
        with self.lock:
            if not self.pending:
                self.groups += 1  # a fresh task_id per group, unique across agent processes too
                task = (f"{self.client_uuid[:8]}-{self.groups}", random.choice(WORDS))
                self.pending = [task] * self.num_repeat
            return self.pending.pop()

    def redo(self, task):
        with self.lock:
            self.pending.append(task)  # else its group stays one episode short for good

    def claim(self):
        delay = 0.1
        while not self.stop.is_set():
            r = self.episode_call("/claim_episode", {"episode_type": "train", "discard_episode_timeout": 600})
            if r.get("success"):
                return r
            self.last_fail_cause = r.get("fail_cause")
            if self.args.verbose:
                print(f"claim refused: {self.last_fail_cause}", flush=True)
            self.stop.wait(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, 2.0)
        return None

    def run_episode(self, ep):
        task = self.next_task()
        task_id, word = task
        try:
            reply = request("POST", ep["openai_base_url"].rstrip("/") + "/chat/completions",
                            {"model": "policy", "max_tokens": 64,
                             "messages": [{"role": "user", "content": f"Reverse this word: {word}"}]},
                            ep["openai_api_key"], self.args.retry_seconds)
            text = reply["choices"][0]["message"].get("content") or ""
            version = reply.get("swarm", {}).get("policy_version", -1)
        except Exception:
            self.redo(task)
            try:
                self.episode_call("/abort_episode", {"episode_uuid": ep["episode_uuid"]})
            except AgentError:
                pass  # gone already, or the server is: the episode times out on its own
            raise
        if version >= self.args.steps:
            self.stop.set()  # the engine is at step N already: more claims would only run past it
        reward = score(word, text)
        output = {"reward": reward, "is_success": reward == 1.0,
                  "log_metrics": {"answer_chars": len(text),
                                  "completion_tokens": reply.get("usage", {}).get("completion_tokens", 0)}}
        try:
            self.episode_call("/end_episode", {"episode_uuid": ep["episode_uuid"], "task_id": task_id,
                                               "workflow_output": output})
        except AgentError as e:
            if e.status != 404 and "is not running" not in str(e):
                raise
            # It timed out, or the batch closed under it: nothing wrong here, so do it again.
            print(f"python_agent: warning: episode dropped: {e}", file=sys.stderr, flush=True)
            return self.redo(task)
        with self.lock:
            self.rewards[version].append(reward)

    def worker(self):
        while not self.stop.is_set():
            try:
                ep = self.claim()
                if ep:
                    self.run_episode(ep)
            except AgentError as e:
                self.fail(str(e))
            except Exception as e:  # a malformed answer, say: stop everything rather than die quietly
                self.fail(f"unexpected {type(e).__name__}: {e}")

    def fail(self, message):
        with self.lock:
            self.fatal = self.fatal or message
        self.stop.set()

    def start_engine(self):
        args = self.args
        status = self.call("/get_engine_status")
        started = status["engine_status"] == "ENGINE.OFFLINE" and not args.no_start
        if started:
            if args.config:
                with open(args.config, encoding="utf-8") as f:
                    job = f.read()
            else:  # a JSON string is a valid YAML scalar, whatever the model path holds
                job = (f"model: {json.dumps(args.model)}\nbatch_size: {args.batch_size}\n"
                       f"num_repeat: {args.num_repeat}\nmax_response_length: 64\n"
                       "project_name: python_agent\n")
            self.call("/sync_train_config", {"yaml_as_string": job}, args.admin_token)
            self.call("/start_engine", {}, args.admin_token)
            print(f"python_agent: starting the engine at {self.url}", flush=True)
        elif status["engine_status"] == "ENGINE.OFFLINE":
            print("python_agent: the engine is OFFLINE (--no-start): waiting for a start", flush=True)
        else:
            print(f"python_agent: the engine is {status['engine_status']}: keeping its config", flush=True)
        deadline = time.monotonic() + args.step_timeout
        while status["engine_status"] != "ENGINE.ROLLING":
            if time.monotonic() > deadline:
                raise AgentError(f"the engine is still {status['engine_status']} after "
                                 f"{args.step_timeout:g} s: {status.get('engine_status_detail')}")
            time.sleep(0.2)
            was, status = status["engine_status"], self.call("/get_engine_status")
            # start_engine is BOOTING when it returns, so OFFLINE after it means the boot failed.
            if status["engine_status"] == "ENGINE.OFFLINE" and (started or was == "ENGINE.BOOTING"):
                raise AgentError(f"the engine failed to boot: {status.get('engine_status_detail')}")
        return status["global_step"]

    def run(self):
        step = self.start_engine()
        pool = self.call("/get_current_batch_rollout_pool_information")
        self.num_repeat = int(pool.get("num_repeat") or 1)
        print(f"python_agent: ROLLING at global_step {step} (until {self.args.steps}); "
              f"{pool.get('batch_size')} tasks x {self.num_repeat} episodes per step; "
              f"{self.args.workers} workers", flush=True)
        workers = concurrent.futures.ThreadPoolExecutor(self.args.workers)
        for _ in range(self.args.workers):
            workers.submit(self.worker)
        args, last_change = self.args, time.monotonic()
        try:
            while step < args.steps and not self.fatal:
                time.sleep(0.1)
                status = self.call("/get_engine_status")
                # The batch of step s was answered (mostly) by the weights of step s - 1.
                for s in range(step + 1, status["global_step"] + 1):
                    with self.lock:
                        rewards = self.rewards.pop(s - 1, [])
                    mean = f"{sum(rewards) / len(rewards):.3f}" if rewards else "-"
                    print(f"step {s}  episodes={len(rewards)}  reward_mean={mean}", flush=True)
                if status["global_step"] != step:
                    step, last_change = status["global_step"], time.monotonic()
                elif status["engine_status"] == "ENGINE.OFFLINE":
                    self.fail(f"the engine went OFFLINE: {status.get('engine_status_detail')}")
                elif time.monotonic() > last_change + args.step_timeout:
                    self.fail(f"global_step stayed at {step} for {args.step_timeout:g} s (engine "
                              f"{status['engine_status']}; last refused claim: {self.last_fail_cause})")
        finally:
            self.stop.set()  # each worker ends (or aborts) the episode in hand, then returns
            workers.shutdown(wait=True)
        if self.fatal:
            raise AgentError(self.fatal)
        print(f"python_agent: done at global_step {step}", flush=True)


def positive(text):
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return int(text)


def main():
    p = argparse.ArgumentParser(description="A swarm agent over the raw HTTP protocol (see the docstring).")
    p.add_argument("--server", default="http://127.0.0.1:10086", help="swarm server URL")
    p.add_argument("--config", help="job YAML file, sent as is to /sync_train_config")
    p.add_argument("--model", default="mock", help="built-in job: model (any name on the mock engine)")
    p.add_argument("--batch-size", type=positive, default=4, help="built-in job: tasks per step")
    p.add_argument("--num-repeat", type=positive, default=4, help="built-in job: episodes per task")
    p.add_argument("--steps", type=positive, default=3, help="exit once the engine's global_step reaches N")
    p.add_argument("--workers", type=positive, default=4, help="episodes run in parallel")
    p.add_argument("--admin-token", default=os.environ.get("SWARM_ADMIN_TOKEN"), help="or $SWARM_ADMIN_TOKEN")
    p.add_argument("--client-token", default=os.environ.get("SWARM_CLIENT_TOKEN"),
                   help="or $SWARM_CLIENT_TOKEN")
    p.add_argument("--no-start", action="store_true", help="never sync a config or start the engine")
    p.add_argument("--retry-seconds", type=float, default=60.0, help="give up on an unreachable server then")
    p.add_argument("--step-timeout", type=float, default=600.0, help="fail when global_step stalls this long")
    p.add_argument("--verbose", action="store_true", help="print every refused claim")
    args = p.parse_args()
    if not args.server.startswith(("http://", "https://")):
        p.error(f"--server must be an http:// or https:// URL, got {args.server!r}")
    if args.config and not os.path.isfile(args.config):
        p.error(f"--config {args.config}: no such file")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # as Ctrl-C: end episodes in hand
    try:
        Agent(args).run()
    except (AgentError, OSError) as e:
        print(f"python_agent: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("python_agent: interrupted (the episodes in hand were finished)", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
