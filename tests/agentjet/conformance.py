#!/usr/bin/python3
"""AgentJet wire conformance: swarm-server against what AgentJet's Python SwarmClient and its
overwatch send and expect (fork charlesHsuGG/AgentJet at c68c154; docs/dev/agentjet-client-notes.md).

Usage: conformance.py <path-to-swarm-server>

Starts `swarm-server start --port 0 --log-level info` (mock engine), sends the client's
requests in its order and shapes, with its headers, validates every response against JSON
Schemas that mirror AgentJet's pydantic v2 models (lax rules: a str field rejects numbers and
null, an int field rejects 1.5, required fields must be present) plus the stricter shapes
swarm-server promises, and replays the client's branch logic on each answer so a check shows
the branch the client would take. Prints `ok  NN name`, `FAIL NN name: why` or
`skip NN name: why` per check; exits 1 if any check failed.

Run with /usr/bin/python3 (needs only the stdlib, PyYAML and jsonschema).
"""

import contextlib
import gzip
import http.client
import io
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
import zipfile
import zlib

import jsonschema
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from agentjet_config import LONG_STRINGS, VERL_SECTION_NAMES, agentjet_job_config, yaml_as_string  # noqa: E402

OFFLINE, BOOTING, ROLLING = "ENGINE.OFFLINE", "ENGINE.BOOTING", "ENGINE.ROLLING"
ROLLING_POST, WEIGHT_SYNCING = "ENGINE.ROLLING_POST", "ENGINE.WEIGHT_SYNCING"
ENGINE_STATES = [OFFLINE, BOOTING, ROLLING, ROLLING_POST, WEIGHT_SYNCING]
TASKS_METHOD = "rollout_until_finish_enough_tasks"
ANY_AGREE = "rollout_until_any_client_agree_sync_weight"
ALL_AGREE = "rollout_until_all_clients_agree_sync_weight"
# A swarm: block of our own flat keys inside the AgentJet YAML: keeps the mock engine quick.
QUICK_SWARM = {"mock_train_seconds": 0, "agree_sync_min_seconds": 1}

# ============================================================================ JSON Schemas
# Pydantic v2 lax mode: str rejects numbers and null; int accepts 1 and 1.0 but not 1.5 (JSON
# Schema "integer" does the same); float accepts ints; bool only booleans here (pydantic
# would also take 0/1 and "true": stricter on purpose, a server should send real booleans).
STR = {"type": "string"}
INT = {"type": "integer"}
FLOAT = {"type": "number"}
BOOL = {"type": "boolean"}
ANY_OBJ = {"type": "object"}


def nullable(t):
    return {"anyOf": [t, {"type": "null"}]}


def array(t):
    return {"type": "array", "items": t}


def dict_of(t):
    return {"type": "object", "additionalProperties": t}


def model(required, optional=None):
    """A pydantic BaseModel (extra="ignore"): required fields, optional fields with defaults."""
    props = dict(required)
    props.update(optional or {})
    return {"type": "object", "required": list(required), "properties": props}


def strict(schema, *also_required):
    """The same model with fields swarm-server promises to send made required."""
    s = json.loads(json.dumps(schema))
    s["required"] = list(dict.fromkeys(s["required"] + list(also_required or s["properties"])))
    return s


# --- AgentJet's models (ajet/tuner_lib/experimental/interchange_utils.py, swarm_overwatch_utils.py)
AJ_CLAIM = model({"success": BOOL, "client_uuid": STR, "episode_uuid": STR},
                 {"openai_base_url": STR, "openai_api_key": STR, "fail_cause": STR})
AJ_END = model({"success": BOOL})
AJ_CAN_CONTINUE = model({"can_continue": BOOL})
AJ_EPISODE_STATUS = model(
    {"episode_uuid": STR, "discard_episode_timeout": FLOAT},
    {"episode_status": STR, "episode_type": STR, "openai_base_url": STR, "openai_api_key": STR,
     "client_uuid": STR, "zmq_listen_result_addr": STR, "latest_activity_timestamp": FLOAT,
     "llm_call_count": INT, "debug_log": array(STR), "optional_task_id": STR})
AJ_BUFFER = model({"buffer": array(AJ_EPISODE_STATUS)})
AJ_BOOL = model({"success": BOOL}, {"failure_reason": STR})
AJ_VERBOSE_LOGS = model({}, {"entries": array(model({"timestamp": FLOAT, "message": STR}, {"tag": STR}))})
AJ_POOL_INFO = model({}, {
    "sample_collection_method": STR,
    "completed_episodes": INT, "completed_episode_target": INT,
    "completed_tasks": INT, "completed_task_target": INT,
    "completed_non_dummy_tasks": INT, "completed_non_dummy_task_target": INT,
    "task_expected_num_repeat": INT,
    "completed_tasks_details": dict_of(array(STR)),
    "completed_tasks_rewards": dict_of(array(FLOAT)),
    "completed_tasks_client_uuids": dict_of(array(STR)),
    "running_episode_details": nullable(dict_of(dict_of(STR))),
    "engine_status": nullable(STR),
    "global_step": nullable(INT),
    "booting_start_time": nullable(FLOAT),
    "training_model_path": nullable(STR),
    "swarm_client_instruction": ANY_OBJ,
})

# --- What swarm-server promises on top (the contract)
ERROR_BODY = model({"detail": STR})
ENGINE_STATUS = model({"engine_status": {"enum": ENGINE_STATES}, "global_step": INT})
SUCCESS = model({"success": BOOL})
EXPERIMENT_DIR = model({"server_experiment_dir": nullable(STR)})
SYNC_CONFIG = model({"success": {"const": True}, "config_format": {"enum": ["agentjet", "swarm"]}})
SYNC_CONFIG_AGENTJET = model({
    "success": {"const": True}, "config_format": {"const": "agentjet"},
    "mapped": array(model({"from": STR, "to": STR, "value": {}})),
    "ignored": array(STR), "warnings": array(STR)})
SYNC_CODE = model({"success": {"const": True}, "message": STR, "temp_ajet_code_path": STR, "note": STR})
CT_CLAIM = strict(AJ_CLAIM)
CT_END = model({"success": BOOL}, {"accepted": BOOL})
CT_BUFFER = model({"buffer": array(strict(AJ_EPISODE_STATUS, "episode_status", "client_uuid", "openai_api_key"))})
CT_BOOL = strict(AJ_BOOL)
RUNNING_DETAIL = model({k: STR for k in ("episode_status", "time_since_last_activity", "discard_episode_timeout",
                                         "llm_call_count", "client_uuid", "optional_task_id")})
ACTIVE_CLIENT = model({"client_uuid": STR, "last_activity_at": FLOAT, "allowed_sync_weight": BOOL})
CT_POOL_INFO = strict(AJ_POOL_INFO)
CT_POOL_INFO["properties"].update({
    "engine_status": {"enum": ENGINE_STATES},
    "global_step": INT,
    "running_episode_details": nullable(dict_of(RUNNING_DETAIL)),
    "swarm_client_instruction": model({"active_clients": array(ACTIVE_CLIENT)}),
})
CT_VERBOSE_LOGS = model({"entries": array(model({"timestamp": FLOAT, "tag": STR, "message": STR}))})
CHAT_COMPLETION = model({
    "id": STR, "object": {"const": "chat.completion"}, "created": INT, "model": STR,
    "choices": {"type": "array", "minItems": 1, "items": model({
        "index": INT, "finish_reason": STR,
        "message": model({"role": {"const": "assistant"}, "content": STR})})}})
CHAT_CHUNK = model({
    "id": STR, "object": {"const": "chat.completion.chunk"}, "created": INT, "model": STR,
    "choices": array(model({"index": INT, "delta": ANY_OBJ}, {"finish_reason": nullable(STR)}))})
REPLAY = model({"input": ANY_OBJ, "output": CHAT_COMPLETION})


def validate(instance, schema, what):
    v = jsonschema.Draft202012Validator(schema)
    errors = sorted(v.iter_errors(instance), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        where = "/".join(str(p) for p in e.absolute_path) or "(top)"
        raise AssertionError(f"{what} does not validate at {where}: {e.message}")
    return instance


# ============================================================================ HTTP like httpx
HTTPX_HEADERS = {"User-Agent": "python-httpx/0.27.0", "Accept": "*/*",
                 "Accept-Encoding": "gzip, deflate", "Connection": "keep-alive"}


class Resp:
    def __init__(self, method, path, status, headers, body):
        self.method, self.path, self.status, self.headers, self.body = method, path, status, headers, body

    @property
    def ok(self):
        return 200 <= self.status < 300

    def json(self):
        try:
            return json.loads(self.body.decode("utf-8"))
        except Exception as e:
            raise AssertionError(f"{self.method} {self.path}: body is not JSON ({e}): {self.body[:200]!r}")

    def json_or_text(self):
        try:
            return json.loads(self.body.decode("utf-8"))
        except Exception:
            return self.body.decode("utf-8", "replace")

    def detail(self):
        """Every non-2xx JSON body has a top-level string `detail`."""
        return validate(self.json(), ERROR_BODY, f"{self.method} {self.path} {self.status} error body")["detail"]

    def expect(self, status, what=""):
        assert self.status == status, (f"{what or self.method + ' ' + self.path}: HTTP {self.status}, expected {status}: "
                                       f"{self.body[:300]!r}")
        return self

    def expect_ok(self, schema, what=None):
        what = what or f"{self.method} {self.path}"
        assert self.ok, f"{what}: HTTP {self.status}: {self.body[:300]!r}"
        return validate(self.json(), schema, what)

    def __repr__(self):
        return f"<{self.method} {self.path} {self.status} {self.body[:200]!r}>"


def _decode(headers, body):
    enc = headers.get("content-encoding", "").lower()
    if enc == "gzip":
        return gzip.decompress(body)
    if enc == "deflate":
        try:
            return zlib.decompress(body)
        except zlib.error:
            return zlib.decompress(body, -zlib.MAX_WBITS)
    return body


class HttpxLike:
    """One pooled HTTP/1.1 keep-alive connection with httpx's default headers, like the
    SwarmClient's `httpx.Client(timeout=30, http2=False)`. `close_each=True` is the overwatch:
    a new connection per request with `Connection: close`."""

    def __init__(self, base_url, timeout=30.0, close_each=False):
        u = urllib.parse.urlsplit(base_url)
        self.host, self.port, self.timeout, self.close_each = u.hostname, u.port, timeout, close_each
        self.conn = None
        self.lock = threading.Lock()
        self.connects = 0
        self.requests = 0

    def _connection(self, timeout):
        if self.conn is None or self.close_each:
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
            self.connects += 1
            return self.conn, False
        if self.conn.sock is not None:
            self.conn.sock.settimeout(timeout)
        return self.conn, True

    def request(self, method, path, json_body=..., content=None, content_type=None, headers=None, timeout=None):
        hdrs = dict(HTTPX_HEADERS)
        if self.close_each:
            hdrs["Connection"] = "close"
        body = None
        if json_body is not ...:
            body = json.dumps(json_body).encode("utf-8")  # httpx: json.dumps with default separators
            hdrs["Content-Type"] = "application/json"
        elif content is not None:
            body = content
            hdrs["Content-Type"] = content_type
        hdrs.update(headers or {})
        timeout = timeout or self.timeout
        with self.lock:
            self.requests += 1
            for attempt in (1, 2):
                conn, reused = self._connection(timeout)
                try:
                    conn.request(method, path, body=body, headers=hdrs)
                    r = conn.getresponse()
                    data = r.read()
                    rh = {k.lower(): v for k, v in r.getheaders()}
                    if self.close_each or r.will_close:
                        conn.close()
                        self.conn = None
                    return Resp(method, path, r.status, rh, _decode(rh, data))
                except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError,
                        http.client.CannotSendRequest, http.client.ResponseNotReady):
                    # httpcore retries once when a pooled idle connection turns out closed.
                    conn.close()
                    self.conn = None
                    if attempt == 2 or not reused:
                        raise

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, body=..., **kw):
        return self.request("POST", path, json_body=body, **kw)


# ============================================================================ the client, replayed
class SwarmClientError(RuntimeError):
    """`raise_for_status_with_detail`: any non-2xx is `RuntimeError("SwarmClient error <code>: ...")`."""


class SwarmServerOfflineError(RuntimeError):
    pass


def raise_for_status_with_detail(resp):
    if not resp.ok:
        raise SwarmClientError(f"SwarmClient error {resp.status}: {resp.json_or_text()}")


def wait_status(http, wanted, timeout=20.0, interval=0.05, raise_on_offline=False):
    """Polls get_engine_status until the status is in `wanted`; returns (last json, statuses seen in order)."""
    wanted = {wanted} if isinstance(wanted, str) else set(wanted)
    seen, deadline = [], time.time() + timeout
    while True:
        st = http.get("/get_engine_status", timeout=10).expect_ok(ENGINE_STATUS)
        s = st["engine_status"]
        if not seen or seen[-1] != s:
            seen.append(s)
        if s in wanted:
            return st, seen
        if raise_on_offline and s == OFFLINE and OFFLINE not in wanted and any(x != OFFLINE for x in seen):
            raise SwarmServerOfflineError(f"went back to OFFLINE while waiting for {sorted(wanted)}: {seen}")
        if time.time() > deadline:
            raise AssertionError(f"status never reached {sorted(wanted)} within {timeout}s; seen {seen}")
        time.sleep(interval)


def wait_step(http, above, timeout=20.0):
    """Waits until the engine is ROLLING with global_step > above; returns (json, statuses seen)."""
    seen, deadline = [], time.time() + timeout
    while True:
        st = http.get("/get_engine_status").expect_ok(ENGINE_STATUS)
        if not seen or seen[-1] != st["engine_status"]:
            seen.append(st["engine_status"])
        if st["engine_status"] == ROLLING and st["global_step"] > above:
            return st, seen
        if time.time() > deadline:
            raise AssertionError(f"no ROLLING with global_step > {above} within {timeout}s; seen {seen}, last {st}")
        time.sleep(0.03)


def workflow_output(reward, task_id, is_success=True, log_metrics=None):
    return {"reward": reward, "is_success": is_success, "metadata": {"task_id": task_id},
            "log_metrics": log_metrics if log_metrics is not None else {}}


TYPICAL_LOG_METRICS = {"acc": 1.0, "turns": [1, 2], "reward_stats": {"final_reward": 1.0}}


def throttle_policy(task_id, batch_size=2, num_repeat=2, ratio=1.5):
    return {"ratio": ratio, "expected_batch_size": batch_size, "expected_num_repeat": num_repeat,
            "current_task_id": task_id}


class SimSwarmClient:
    """AgentJet's SwarmClient, one request at a time: each method sends what the client sends
    and returns the branch it takes on the answer (instead of sleeping and retrying)."""

    def __init__(self, base_url, job_method=TASKS_METHOD):
        self.base_url = base_url
        self.http = HttpxLike(base_url, timeout=30)
        self.client_uuid = str(uuid.uuid4())
        self.job_method = job_method
        self.record_episode_expire_time = {}
        self.recent_seen_tasks = []
        self.last = None  # the last Resp

    def status(self):
        return self.http.get("/get_engine_status", timeout=10).expect_ok(ENGINE_STATUS)["engine_status"]

    # --- R2, R3, R4, R5
    def sync_train_config(self, cfg):
        if self.status() != OFFLINE:
            raise RuntimeError("sync_train_config refused locally: engine not OFFLINE")
        text = cfg if isinstance(cfg, str) else yaml_as_string(cfg)
        if isinstance(cfg, dict) and "ajet" in cfg:
            self.job_method = cfg["ajet"].get("swarm_mode_sample_collection_method", TASKS_METHOD)
        self.last = self.http.post("/sync_train_config", {"yaml_as_string": text})
        raise_for_status_with_detail(self.last)
        return self.last

    def start_engine(self, on_booting=None):
        if self.status() != OFFLINE:
            raise RuntimeError("start_engine refused locally: engine not OFFLINE")
        self.last = self.http.post("/start_engine", {}, timeout=600)
        raise_for_status_with_detail(self.last)
        data = validate(self.last.json(), SUCCESS, "start_engine response")
        if not data["success"]:
            raise RuntimeError("Failed to start training engine")
        seen, deadline = [], time.time() + 30
        while True:
            st = self.http.get("/get_engine_status").expect_ok(ENGINE_STATUS)
            s = st["engine_status"]
            if not seen or seen[-1] != s:
                seen.append(s)
            if s == BOOTING and on_booting:
                on_booting()
                on_booting = None
            if s == ROLLING:
                return seen
            if s == OFFLINE and any(x != OFFLINE for x in seen):
                raise SwarmServerOfflineError(f"engine went back to OFFLINE while booting: {seen}")
            if time.time() > deadline:
                raise AssertionError(f"no ENGINE.ROLLING 30 s after start_engine; seen {seen}")
            time.sleep(0.05)

    def stop_engine(self):
        if self.status() == OFFLINE:
            return None
        self.last = self.http.post("/stop_engine", {}, timeout=600)
        raise_for_status_with_detail(self.last)
        if not validate(self.last.json(), SUCCESS, "stop_engine response")["success"]:
            raise RuntimeError("Failed to stop training engine")
        wait_status(self.http, OFFLINE, timeout=30)
        return self.last

    # --- R6 (+ R7), one attempt
    def begin_episode_attempt(self, discard_episode_timeout=240.0, episode_type="train", throttle=None,
                              cached_status=None):
        """Returns (branch, claim json or None, throttle reason). Branches: claimed,
        wait_rolling (not sent), throttled (not sent, retry 2 s), retry_quiet_15s,
        retry_2s, retry_warn_15s, error_retry_15s."""
        status = cached_status or self.status()
        if status != ROLLING:
            return "wait_rolling", None, ""
        if throttle is not None and episode_type == "train":
            pool = self.get_rollout_stat()
            throttled, reason = self.check_throttle_policy(throttle, pool)
            if throttled:
                return "throttled", None, reason
            self.remember_seen_task(throttle)
        body = {"client_uuid": self.client_uuid, "episode_type": episode_type,
                "discard_episode_timeout": float(discard_episode_timeout), "throttle_policy": throttle}
        self.last = self.http.post("/claim_episode", body)
        if not self.last.ok:
            self.last.detail()
            return "error_retry_15s", None, ""
        data = validate(self.last.json(), AJ_CLAIM, "ClaimEpisodeResponse")
        validate(data, CT_CLAIM, "claim_episode response (contract)")
        self.record_episode_expire_time[data["episode_uuid"]] = time.time() + 8 * discard_episode_timeout
        if data["success"]:
            data = dict(data)
            data["openai_base_url"] = re.sub(r"^https?://[^/]+", self.base_url, data.get("openai_base_url", ""))
            return "claimed", data, ""
        cause = data.get("fail_cause", "")
        if "Engine is syncing weights" in cause or "Engine is in post-rolling phase" in cause:
            return "retry_quiet_15s", data, ""
        if "No available episodes to claim." in cause:
            return "retry_2s", data, ""
        return "retry_warn_15s", data, ""

    def claim(self, task_id=None, **kw):
        """A claim that must succeed; returns the claim json."""
        branch, data, reason = self.begin_episode_attempt(
            throttle=throttle_policy(task_id) if task_id else None, **kw)
        assert branch == "claimed", f"begin_episode took branch {branch} ({reason or data or self.last})"
        return data

    def get_rollout_stat(self):
        self.last = self.http.get("/get_current_batch_rollout_pool_information", timeout=10)
        info = self.last.expect_ok(AJ_POOL_INFO, "CurrentBatchRolloutPoolInformation")
        validate(info, CT_POOL_INFO, "pool information (contract)")
        return info

    def check_throttle_policy(self, policy, pool):
        """The client-side throttle decision (notes §3.6), written from its description."""
        assert self.job_method == TASKS_METHOD, "throttle policy needs rollout_until_finish_enough_tasks"
        me, wanted = self.client_uuid, policy["current_task_id"]
        mine, alien, count = set(), set(), {}
        for task, clients in pool.get("completed_tasks_client_uuids", {}).items():
            for c in clients:
                count[task] = count.get(task, 0) + 1
                if c != me:
                    alien.add(task)
                if c == me:
                    mine.add(task)
                    break
        running = pool.get("running_episode_details")
        if running is None:
            done = sum(1 for n in count.values() if n >= policy["expected_num_repeat"])
            if done < policy["expected_batch_size"]:
                return False, "no running episodes and the batch is not complete"
        else:
            for detail in running.values():
                c, task = detail.get("client_uuid", ""), detail.get("optional_task_id", "")
                count[task] = count.get(task, 0) + 1
                if c != me:
                    alien.add(task)
                if task and c == me:
                    mine.add(task)
        if wanted in self.recent_seen_tasks or wanted in mine or wanted in alien:
            return False, "task already seen, mine or another client's"
        limit = policy["expected_batch_size"] * policy["ratio"]
        n = len(mine - alien)
        if n >= limit:
            return True, f"{n} unique tasks of mine >= {limit}"
        return False, f"{n} unique tasks of mine < {limit}"

    def remember_seen_task(self, policy):
        cap = policy["expected_batch_size"] * policy["expected_num_repeat"] * 3
        if policy["current_task_id"] not in self.recent_seen_tasks:
            self.recent_seen_tasks = (self.recent_seen_tasks + [policy["current_task_id"]])[-cap:]

    # --- R15
    def chat(self, claim, content="hi", stream=False):
        u = urllib.parse.urlsplit(claim["openai_base_url"])
        body = {"model": "any", "messages": [{"role": "user", "content": content}]}
        if stream:
            body["stream"] = True
        req = urllib.request.Request(claim["openai_base_url"] + "/chat/completions", method="POST",
                                     data=json.dumps(body).encode(), headers={
                                         "Authorization": f"Bearer {claim['openai_api_key']}",
                                         "Content-Type": "application/json", "Accept": "application/json",
                                         "User-Agent": "OpenAI/Python 1.51.0", "X-Stainless-Lang": "python"})
        assert u.path.endswith("/v1"), f"openai_base_url {claim['openai_base_url']!r} does not end in /v1"
        try:
            r = urllib.request.urlopen(req, timeout=30)
        except urllib.error.HTTPError as e:
            raise AssertionError(f"chat completion: HTTP {e.code}: {e.read()[:300]!r}")
        return body, r

    def chat_completion(self, claim, content="hi"):
        body, r = self.chat(claim, content)
        with r:
            data = validate(json.loads(r.read()), CHAT_COMPLETION, "ChatCompletion")
        return body, data

    # --- R8, R9, R10, R11, R12, R13
    def end_episode(self, task_id, episode_uuid, output, declare_client_active=True):
        """Returns 'ended' or 'discarded' (400 with WEIGHT_SYNCING in detail), or 'rerouted_to_abort';
        raises SwarmClientError / RuntimeError like the client."""
        assert task_id, "the client asserts a non-empty task_id"
        if episode_uuid not in self.record_episode_expire_time or \
                time.time() > self.record_episode_expire_time[episode_uuid]:
            self.abort_episode(episode_uuid)
            return "rerouted_to_abort"
        out = dict(output)
        out["metadata"] = dict(out.get("metadata", {}), task_id=task_id)
        body = {"client_uuid": self.client_uuid, "episode_uuid": episode_uuid, "workflow_output": out,
                "task_id": task_id, "declare_client_active": declare_client_active}
        self.last = r = self.http.post("/end_episode", body)
        parsed = r.json_or_text()
        if r.status == 400 and "WEIGHT_SYNCING" in str(parsed.get("detail", "") if isinstance(parsed, dict) else ""):
            return "discarded"
        if not r.ok:
            r.detail()
        raise_for_status_with_detail(r)
        data = validate(r.json(), AJ_END, "EndEpisodeResponse")
        validate(data, CT_END, "end_episode response (contract)")
        if not data["success"]:
            raise RuntimeError(f"Failed to end episode {episode_uuid}")
        return "ended"

    def abort_episode(self, episode_uuid, declare_client_active=True):
        """Never raises in the client; returns 'aborted', 'logged_failure' or 'logged_error'."""
        body = {"client_uuid": self.client_uuid, "episode_uuid": episode_uuid,
                "workflow_output": {"reward": 0.0, "is_success": None, "metadata": {}, "log_metrics": {}},
                "task_id": "", "declare_client_active": declare_client_active}
        self.last = r = self.http.post("/abort_episode", body)
        if not r.ok:
            r.detail()
            return "logged_error"
        data = validate(r.json(), AJ_END, "EndEpisodeResponse (abort)")
        return "aborted" if data["success"] else "logged_failure"

    def can_continue_episode(self, episode_uuid):
        self.last = r = self.http.post("/can_continue_episode",
                                       {"client_uuid": self.client_uuid, "episode_uuid": episode_uuid}, timeout=10)
        return r.expect_ok(AJ_CAN_CONTINUE, "CanContinueEpisodeResponse")["can_continue"]

    def get_episode_buffer(self):
        self.last = r = self.http.post("/get_episode_buffer", {}, timeout=10)
        data = r.expect_ok(AJ_BUFFER, "EpisodeBufferResponse")
        validate(data, CT_BUFFER, "get_episode_buffer response (contract)")
        return data["buffer"]

    def server_experiment_dir(self):
        self.last = r = self.http.get("/get_server_experiment_dir", timeout=10)
        return r.expect_ok(EXPERIMENT_DIR, "get_server_experiment_dir response")["server_experiment_dir"]

    def agree_attempt(self, client_uuid=None, cached_status=None):
        """Returns (branch, json): not_rolling (not sent), agreed (then waits for
        ROLLING_POST/WEIGHT_SYNCING), rejected (retry 2 s), error_retry_2s."""
        assert self.job_method in (ANY_AGREE, ALL_AGREE) or cached_status == "force", \
            "the client asserts an agree collection method locally"
        status = cached_status if cached_status not in (None, "force") else self.status()
        if status not in (ROLLING, ROLLING_POST):
            return "not_rolling", None
        self.last = r = self.http.post("/agree_sync_weight",
                                       {"client_uuid": self.client_uuid if client_uuid is None else client_uuid},
                                       timeout=10)
        if not r.ok:
            r.detail()
            return "error_retry_2s", None
        data = validate(r.json(), AJ_BOOL, "BoolResponse")
        validate(data, CT_BOOL, "agree_sync_weight response (contract)")
        return ("agreed" if data["success"] else "rejected"), data


class Overwatch:
    """`ajet-swarm overwatch`: Connection: close on every request, timeouts 5/2/30 s."""

    def __init__(self, base_url):
        self.http = HttpxLike(base_url, timeout=5, close_each=True)

    def fetch_pool(self):
        r = self.http.get("/get_current_batch_rollout_pool_information", timeout=5)
        info = r.expect_ok(AJ_POOL_INFO, "overwatch: CurrentBatchRolloutPoolInformation")
        validate(info, CT_POOL_INFO, "overwatch: pool information (contract)")
        self.render(info)
        return info

    @staticmethod
    def render(info):
        """Everything the overwatch reads to draw its panels; raises where it would."""
        lines = [f"{info.get('engine_status')} step {info.get('global_step')} model {info.get('training_model_path')}"]
        if info.get("booting_start_time") is not None:
            lines.append(f"Booting Time: {time.time() - info['booting_start_time']:.0f}s")
        details = info.get("completed_tasks_details", {})
        rewards = info.get("completed_tasks_rewards", {})
        for task, uuids in details.items():
            rs = rewards.get(task, [])
            mean = sum(rs) / len(rs) if rs else 0.0
            std = math.sqrt(sum((x - mean) ** 2 for x in rs) / len(rs)) if rs else 0.0
            lines.append(f"Task-{task} ({len(uuids)}) {mean:.2f} ± {std:.2f}")
        running = info.get("running_episode_details") or {}
        for ep, d in sorted(running.items(), key=lambda kv: float(kv[1]["time_since_last_activity"].rstrip("s"))):
            lines.append(f"{ep} {d['episode_status']} {d['time_since_last_activity']} / "
                         f"{d.get('discard_episode_timeout')} {d.get('task_id')}")
        for c in info.get("swarm_client_instruction", {}).get("active_clients", []):
            lines.append(f"client {c['client_uuid']} agreed={c['allowed_sync_weight']}")
        return lines

    def verbose_logs(self):
        r = self.http.get("/get_verbose_logs", timeout=2)
        data = r.expect_ok(AJ_VERBOSE_LOGS, "VerboseLogsResponse")
        return validate(data, CT_VERBOSE_LOGS, "get_verbose_logs response (contract)")["entries"]

    def replay(self):
        return self.http.post("/replay_latest_llm_call", timeout=30)


class StatusPoller(threading.Thread):
    """The SwarmClient's background poller: GET /get_engine_status every 0.33 s on its own connection."""

    def __init__(self, base_url):
        super().__init__(daemon=True)
        self.http = HttpxLike(base_url, timeout=10)
        self.stop_event = threading.Event()
        self.polls, self.errors, self.statuses = 0, [], set()

    def run(self):
        while not self.stop_event.wait(0.33):
            try:
                st = self.http.get("/get_engine_status", timeout=10).expect_ok(ENGINE_STATUS)
                self.statuses.add(st["engine_status"])
                self.polls += 1
            except Exception as e:  # noqa: BLE001
                self.errors.append(f"{type(e).__name__}: {e}")


# ============================================================================ checks
class ScenarioAborted(Exception):
    pass


class Skip(Exception):
    pass


class Report:
    def __init__(self):
        self.n, self.failed, self.passed, self.skipped = 0, [], 0, 0

    @contextlib.contextmanager
    def check(self, name, critical=False):
        self.n += 1
        label = f"{self.n:02d} {name}"
        try:
            yield
        except Skip as e:
            self.skipped += 1
            print(f"skip {label}: {e}", flush=True)
        except ScenarioAborted:
            raise
        except Exception as e:  # noqa: BLE001
            why = str(e) if isinstance(e, AssertionError) else f"{type(e).__name__}: {e}"
            self.failed.append(label)
            print(f"FAIL {label}: {why}", flush=True)
            if critical:
                raise ScenarioAborted(label)
        else:
            self.passed += 1
            print(f"ok  {label}", flush=True)


R = Report()
check = R.check


def eq(actual, expected, what):
    assert actual == expected, f"{what}: got {actual!r}, expected {expected!r}"


def contains(text, needle, what):
    assert needle in (text or ""), f"{what}: {needle!r} not in {text!r}"


def make_zip(members):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


def quick_agentjet(method=TASKS_METHOD, batch_size=2, num_repeat=2, swarm=None, **more):
    overrides = {"model.path": "m", "data.train_batch_size": batch_size, "rollout.num_repeat": num_repeat,
                 "swarm_mode_sample_collection_method": method, "experiment_name": "conformance"}
    overrides.update(more)
    cfg = agentjet_job_config(**overrides)
    cfg["swarm"] = dict(QUICK_SWARM, **(swarm or {}))
    return cfg


def value_matches(value, expected):
    """expected: a value, a float (compared with a tolerance) or a tuple of acceptable values."""
    if isinstance(expected, tuple):
        return any(value_matches(value, e) for e in expected)
    if isinstance(expected, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isclose(value, expected)
    return value == expected and type(value) is type(expected)


def pool_entry(info, episode_uuid):
    running = info.get("running_episode_details") or {}
    assert episode_uuid in running, f"episode {episode_uuid} not in running_episode_details {running}"
    return running[episode_uuid]


def seconds(value, what):
    assert isinstance(value, str) and value.endswith("s"), f"{what}: {value!r} is not '<seconds>s'"
    return float(value.rstrip("s"))


def active_clients(info):
    return {c["client_uuid"]: c for c in info["swarm_client_instruction"]["active_clients"]}


def ensure_offline(base):
    http = HttpxLike(base, timeout=30)
    try:
        if http.get("/get_engine_status").json().get("engine_status") != OFFLINE:
            http.post("/stop_engine", {}, timeout=600)
            wait_status(http, OFFLINE, timeout=30)
    except Exception as e:  # noqa: BLE001
        print(f"# cleanup: could not bring the engine to OFFLINE: {e}", flush=True)


# ---------------------------------------------------------------------------- scenarios
def scenario_fresh_server(base, ow):
    cl = SimSwarmClient(base)
    with check("get_engine_status on a fresh server: ENGINE.OFFLINE, global_step int", critical=True):
        eq(cl.status(), OFFLINE, "engine_status")
    with check("get_server_experiment_dir before the first start_engine: null"):
        eq(cl.server_experiment_dir(), None, "server_experiment_dir")
    with check("overwatch: pool information while OFFLINE validates, running_episode_details null"):
        info = ow.fetch_pool()
        eq(info["running_episode_details"], None, "running_episode_details")
        eq(info["booting_start_time"], None, "booting_start_time")
        eq(info["engine_status"], OFFLINE, "engine_status")
    with check("overwatch: get_verbose_logs validates"):
        ow.verbose_logs()
    with check("overwatch: replay_latest_llm_call before any chat call: 404 'No LLM call has been made yet'"):
        r = ow.replay().expect(404)
        contains(r.detail(), "No LLM call has been made yet", "detail")
    with check("claim_episode while OFFLINE: refused, episode_uuid \"\" (or an error with detail)"):
        branch, data, _ = cl.begin_episode_attempt(cached_status=ROLLING)
        assert branch != "claimed", "claimed an episode while OFFLINE"
        if data is not None:
            eq(data["episode_uuid"], "", "episode_uuid on failure")
            eq(data["client_uuid"], cl.client_uuid, "client_uuid echoed")
    with check("end_episode while OFFLINE: the client raises (non-2xx with detail, not the WEIGHT_SYNCING discard)"):
        cl.record_episode_expire_time["e-offline"] = time.time() + 999
        try:
            branch = cl.end_episode("t0", "e-offline", workflow_output(1.0, "t0"))
            raise AssertionError(f"the client took branch {branch!r}: {cl.last}")
        except SwarmClientError:
            cl.last.detail()
    with check("abort_episode while OFFLINE: 200 success true"):
        eq(cl.abort_episode(str(uuid.uuid4())), "aborted", "abort branch")
    with check("can_continue_episode while OFFLINE: false"):
        eq(cl.can_continue_episode(str(uuid.uuid4())), False, "can_continue")
    with check("get_episode_buffer while OFFLINE: empty buffer"):
        eq(cl.get_episode_buffer(), [], "buffer")


def scenario_sync_train_config(base):
    cl = SimSwarmClient(base)
    cfg = agentjet_job_config(**{"model.path": "m", "data.train_batch_size": 2, "rollout.num_repeat": 2,
                                 "rollout.max_response_length_in_one_turn": 1024})
    text = yaml_as_string(cfg)
    with check("the test's AgentJet YAML has what a real dump has (folded strings, ${...}, re:, 1.0e-06, {}, [])"):
        eq(yaml.safe_load(text), cfg, "YAML round trip")
        assert all(s not in text for s in LONG_STRINGS), "no long string was folded over lines"
        for needle in ("${oc.select:actor_rollout_ref.rollout.multi_turn.tool_config_path,null}", "re:.*mlp.gate$",
                       "1.0e-06", ": {}", ": []", ": null", "\ndefaults:\n- verl_default", "\nhydra:\n"):
            contains(text, needle, "YAML text")
    with check("sync_train_config with the AgentJet YAML: 200, config_format agentjet, mapped/ignored/warnings"):
        data = cl.sync_train_config(cfg).expect_ok(SYNC_CONFIG_AGENTJET, "sync_train_config response")
        mapped = {m["from"]: m for m in data["mapped"]}
        expect = [("ajet.model.path", "model", "m"), ("ajet.data.train_batch_size", "batch_size", 2),
                  ("ajet.rollout.num_repeat", "num_repeat", 2),
                  ("ajet.swarm_mode_sample_collection_method", "sample_collection_method", TASKS_METHOD),
                  ("ajet.rollout.max_response_length_in_one_turn", "max_response_length", (1024, 1008)),
                  ("ajet.trainer_common.optim.lr", "learning_rate", 1e-6),
                  ("ajet.trainer_common.kl_loss_type", "kl_estimator", "k3")]
        for src, dst, value in expect:
            assert src in mapped, f"{src} not in mapped ({sorted(mapped)})"
            eq(mapped[src]["to"], dst, f"mapped[{src}].to")
            v = mapped[src]["value"]
            assert value_matches(v, value), f"mapped[{src}].value: got {v!r}, expected {value!r}"
        for section in VERL_SECTION_NAMES + ["defaults", "hydra"]:
            assert any(i == section or re.match(re.escape(section) + r"[.:\s(]", i) for i in data["ignored"]), \
                f"top-level {section!r} not in ignored {data['ignored']}"
        assert not any(i.startswith("ajet.model") for i in data["ignored"]), "ajet.model.path reported as ignored"
    with check("sync_train_config with ajet.lora.lora_rank 8: 400 naming ajet.lora.lora_rank; the client raises"):
        try:
            cl.sync_train_config(agentjet_job_config(**{"model.path": "m", "lora.lora_rank": 8}))
            raise AssertionError(f"accepted: {cl.last}")
        except SwarmClientError:
            cl.last.expect(400)
            contains(cl.last.detail(), "ajet.lora.lora_rank", "detail")
    with check("sync_train_config with adv_estimator gae_banana: 400 naming ajet.trainer_common.algorithm.adv_estimator"):
        try:
            cl.sync_train_config(agentjet_job_config(**{"model.path": "m",
                                                        "trainer_common.algorithm.adv_estimator": "gae_banana"}))
            raise AssertionError(f"accepted: {cl.last}")
        except SwarmClientError:
            cl.last.expect(400)
            contains(cl.last.detail(), "ajet.trainer_common.algorithm.adv_estimator", "detail")
    with check("sync_train_config with the flat format: 200, config_format swarm"):
        data = cl.sync_train_config("model: m\nbatch_size: 2\n").expect_ok(SYNC_CONFIG, "sync_train_config response")
        eq(data["config_format"], "swarm", "config_format")
    with check("still ENGINE.OFFLINE after the config calls"):
        eq(cl.status(), OFFLINE, "engine_status")


def scenario_sync_train_code(base):
    http = HttpxLike(base, timeout=600)

    def post_zip(data):
        return http.request("POST", "/sync_train_code", content=data, content_type="application/zip", timeout=600)

    with check("sync_train_code with a valid ajet/ zip: 200 success, message, temp_ajet_code_path, note"):
        data = post_zip(make_zip({"ajet/__init__.py": "", "ajet/copilot/job.py": "x = 1\n",
                                  "ajet/default_config/ajet_default.yaml": "ajet: {}\n"})).expect_ok(
            SYNC_CODE, "sync_train_code response")
        contains(data["note"].lower(), "python", "note")
    bad = [("not a zip", b"this is not a zip file at all", "not a valid zip"),
           ("an empty zip", make_zip({}), "empty"),
           ("a member ../evil.py", make_zip({"ajet/ok.py": "", "../evil.py": "x"}), "Unsafe zip member path"),
           ("a member /abs.py", make_zip({"ajet/ok.py": "", "/abs.py": "x"}), "Unsafe zip member path"),
           ("a member other/x.py", make_zip({"ajet/ok.py": "", "other/x.py": "x"}), "must be under ajet/")]
    for what, payload, needle in bad:
        with check(f"sync_train_code with {what}: 400 with '{needle}' in detail"):
            r = post_zip(payload).expect(400)
            contains(r.detail(), needle, "detail")


def scenario_client_session(base, ow):
    """The tutorial order (notes §1.4) with the default tasks method and a throttle policy."""
    c1, c2, c3, c4 = (SimSwarmClient(base) for _ in range(4))
    cfg = quick_agentjet(swarm={"mock_boot_seconds": 1.0})
    booting = {}

    with check("client: cached status OFFLINE, sync_train_config (AgentJet YAML with a swarm: block): 200 agentjet",
               critical=True):
        eq(c1.status(), OFFLINE, "engine_status")
        data = c1.sync_train_config(cfg).expect_ok(SYNC_CONFIG_AGENTJET, "sync_train_config response")
        eq(data["config_format"], "agentjet", "config_format")

    def on_booting():
        booting["t"] = time.time()
        try:
            booting["info"] = ow.fetch_pool()
        except Exception as e:  # noqa: BLE001 (reported by the BOOTING check)
            booting["error"] = e

    with check("client: start_engine -> success true, then ENGINE.ROLLING (via BOOTING)", critical=True):
        t0 = time.time()
        seen = c1.start_engine(on_booting=on_booting)
        assert seen[-1] == ROLLING, seen
        booting["seen"], booting["start"] = seen, t0
    with check("overwatch while BOOTING: booting_start_time is a unix float (swarm: mock_boot_seconds applied)"):
        if "error" in booting:
            raise booting["error"]
        if "info" not in booting:
            raise AssertionError(f"never saw ENGINE.BOOTING (statuses {booting.get('seen')}): "
                                 "is the swarm: block's mock_boot_seconds applied?")
        info = booting["info"]
        if info["engine_status"] != BOOTING:
            raise Skip(f"the boot ended before the pool information was read ({info['engine_status']})")
        bst = info["booting_start_time"]
        assert isinstance(bst, (int, float)) and booting["start"] - 5 <= bst <= booting["t"] + 1, \
            f"booting_start_time {bst!r} not within the boot ({booting['start']:.1f}..{booting['t']:.1f})"
    with check("get_server_experiment_dir after start_engine: an absolute path holding the uploaded code"):
        d = c1.server_experiment_dir()
        assert isinstance(d, str) and os.path.isabs(d), f"server_experiment_dir {d!r}"
        # scenario_sync_train_code uploaded an archive before this config and start: it is
        # copied into this run's directory (stored, never run).
        with zipfile.ZipFile(os.path.join(d, "agentjet_code.zip")) as z:
            assert "ajet/copilot/job.py" in z.namelist(), z.namelist()
    with check("sync_train_config while ROLLING: 409 with detail"):
        r = c1.http.post("/sync_train_config", {"yaml_as_string": yaml_as_string(cfg)}).expect(409)
        r.detail()
    with check("sync_train_code while ROLLING: 409 with detail"):
        r = c1.http.request("POST", "/sync_train_code", content=make_zip({"ajet/a.py": ""}),
                            content_type="application/zip").expect(409)
        r.detail()
    with check("agree_sync_weight with a non-agree method: 409 with detail"):
        eq(c1.agree_attempt(cached_status="force")[0], "error_retry_2s", "agree branch")
        c1.last.expect(409)
    with check("pool information at ROLLING: targets, training_model_path, running_episode_details null"):
        info = ow.fetch_pool()
        for k, v in [("completed_episode_target", 4), ("completed_task_target", 2),
                     ("completed_non_dummy_task_target", 2), ("task_expected_num_repeat", 2),
                     ("completed_episodes", 0), ("completed_tasks", 0), ("completed_tasks_details", {}),
                     ("running_episode_details", None), ("engine_status", ROLLING), ("booting_start_time", None),
                     ("training_model_path", "m"), ("sample_collection_method", TASKS_METHOD)]:
            eq(info[k], v, k)
        eq(active_clients(info), {}, "active clients")

    e1 = {}
    with check("begin_episode with throttle_policy t0: pool info read, not throttled, claimed; base URL ends /v1",
               critical=True):
        claim = c1.claim("t0")
        assert claim["episode_uuid"] and claim["openai_api_key"], claim
        assert claim["openai_base_url"].endswith("/v1"), claim["openai_base_url"]
        e1.update(claim)
    with check("pool information: the claimed episode in running_episode_details, all values strings"):
        d = pool_entry(ow.fetch_pool(), e1["episode_uuid"])
        eq(d["episode_status"], "claimed", "episode_status")
        eq(d["client_uuid"], c1.client_uuid, "client_uuid")
        eq(d["optional_task_id"], "t0", "optional_task_id")
        eq(d["llm_call_count"], "0", "llm_call_count")
        eq(seconds(d["discard_episode_timeout"], "discard_episode_timeout"), 240.0, "discard_episode_timeout")
        assert 0 <= seconds(d["time_since_last_activity"], "time_since_last_activity") < 30, d
    with check("get_episode_buffer: the running episode, status claimed, openai_api_key \"\""):
        buf = {e["episode_uuid"]: e for e in c1.get_episode_buffer()}
        assert e1["episode_uuid"] in buf, f"{e1['episode_uuid']} not in buffer {list(buf)}"
        e = buf[e1["episode_uuid"]]
        eq(e["episode_status"], "claimed", "episode_status")
        eq(e["openai_api_key"], "", "openai_api_key")
        eq(e["client_uuid"], c1.client_uuid, "client_uuid")
        eq(e["discard_episode_timeout"], 240.0, "discard_episode_timeout")
    chat = {}
    with check("chat completion on the claimed key (host-rewritten base URL, Bearer key): content a string"):
        chat["body"], chat["out"] = c1.chat_completion(e1)
    with check("pool information: llm_call_count \"1\" after one chat call"):
        eq(pool_entry(ow.fetch_pool(), e1["episode_uuid"])["llm_call_count"], "1", "llm_call_count")
    with check("overwatch: replay_latest_llm_call returns that request and its ChatCompletion"):
        if not chat:
            raise Skip("no chat call was made")
        data = ow.replay().expect_ok(REPLAY, "replay_latest_llm_call")
        eq(data["input"], chat["body"], "input")
        eq(data["output"]["choices"][0]["message"]["content"], chat["out"]["choices"][0]["message"]["content"],
           "output content")
    with check("stream: true: 200 text/event-stream at once; ':' comment lines tolerated; chunks; [DONE]"):
        body, r = c1.chat(e1, stream=True)
        with r:
            eq(r.status, 200, "status")
            contains(r.headers.get("Content-Type", ""), "text/event-stream", "Content-Type")
            text, done, comments = "", False, 0
            for raw in r:
                line = raw.decode("utf-8").rstrip("\r\n")
                if not line:
                    continue
                if line.startswith(":"):
                    comments += 1
                    continue
                assert line.startswith("data: "), f"unexpected SSE line {line!r}"
                if line == "data: [DONE]":
                    done = True
                    break
                chunk = validate(json.loads(line[6:]), CHAT_CHUNK, "chat.completion.chunk")
                for ch in chunk["choices"]:
                    text += ch["delta"].get("content") or ""
            assert done, "no data: [DONE]"
        chat["stream_body"] = body
    with check("overwatch: replay_latest_llm_call after a streamed call: its request, a ChatCompletion output"):
        if "stream_body" not in chat:
            raise Skip("the streamed call failed")
        data = ow.replay().expect_ok(REPLAY, "replay_latest_llm_call")
        eq(data["input"], chat["stream_body"], "input")
    with check("can_continue_episode on the running episode: true"):
        eq(c1.can_continue_episode(e1["episode_uuid"]), True, "can_continue")
    with check("end_episode (reward 1.0, log_metrics with a list and a dict): 200 success true -> 'ended'"):
        eq(c1.end_episode("t0", e1["episode_uuid"], workflow_output(1.0, "t0", True, TYPICAL_LOG_METRICS)), "ended",
           "end branch")
    with check("pool information after 1 of 2 episodes of t0: completed_episodes 1, details/rewards/client uuids"):
        info = ow.fetch_pool()
        eq(info["completed_episodes"], 1, "completed_episodes")
        eq(info["completed_tasks"], 0, "completed_tasks")
        eq(info["completed_tasks_details"], {"t0": [e1["episode_uuid"]]}, "completed_tasks_details")
        eq(info["completed_tasks_rewards"], {"t0": [1.0]}, "completed_tasks_rewards")
        eq(info["completed_tasks_client_uuids"], {"t0": [c1.client_uuid]}, "completed_tasks_client_uuids")
        eq(info["running_episode_details"], None, "running_episode_details")
        assert c1.client_uuid in active_clients(info), "the client is not in active_clients after a declared end"
    with check("can_continue_episode after the end: false"):
        eq(c1.can_continue_episode(e1["episode_uuid"]), False, "can_continue")
    with check("abort_episode of an ended episode and of an unknown one: 200 success true"):
        eq(c1.abort_episode(e1["episode_uuid"]), "aborted", "abort of the ended episode")
        eq(c1.abort_episode(str(uuid.uuid4())), "aborted", "abort of an unknown episode")
    with check("end_episode again on the ended episode (a retry whose answer was lost): the first answer again, "
               "'ended', counted once"):
        # Where AgentJet's server raises, ours answers a repeated end with the recorded outcome
        # (docs/reliability.md, "Retries never duplicate or lose an episode"): the client takes
        # the same branch and the episode is not counted twice.
        eq(c1.end_episode("t0", e1["episode_uuid"], workflow_output(1.0, "t0")), "ended", "end branch")
        eq(c1.last.json().get("accepted"), True, "accepted")
        eq(ow.fetch_pool()["completed_episodes"], 1, "completed_episodes")
    with check("end_episode with a list reward [0.5, 1.0]: 200 success true, accepted, trained on the sum (turn rewards)"):
        claim = c2.claim()
        c2.end_episode("tlist", claim["episode_uuid"], workflow_output([0.5, 1.0], "tlist"))
        eq(c2.last.json().get("accepted"), True, "accepted")
        info = ow.fetch_pool()
        eq(info["completed_episodes"], 2, "completed_episodes")
        assert "tlist" in info["completed_tasks_details"], info["completed_tasks_details"]
    with check("eval episode: claimed and ended (success true), not counted in the batch"):
        claim = c2.claim(episode_type="eval")
        eq(c2.end_episode("teval", claim["episode_uuid"], workflow_output(1.0, "teval")), "ended", "end branch")
        eq(ow.fetch_pool()["completed_episodes"], 2, "completed_episodes")
    with check("claim_episode with episode_type banana: 400 with detail"):
        eq(c2.begin_episode_attempt(episode_type="banana")[0], "error_retry_15s", "claim branch")
        c2.last.expect(400)
    with check("throttle: the client's own decision on the server's running_episode_details throttles a new task"):
        policy = throttle_policy("ta", batch_size=1, num_repeat=2, ratio=1.0)
        branch, claim, reason = c3.begin_episode_attempt(throttle=policy)
        eq(branch, "claimed", f"first claim ({reason})")
        branch, _, reason = c3.begin_episode_attempt(throttle=dict(policy, current_task_id="tb"))
        eq(branch, "throttled", f"second claim for a new task ({reason})")
        eq(c3.abort_episode(claim["episode_uuid"]), "aborted", "abort")
    held = []
    with check("all slots busy: success false, episode_uuid \"\", 'No available episodes to claim.' -> retry in 2 s"):
        for _ in range(64):
            branch, data, _ = c4.begin_episode_attempt()
            if branch != "claimed":
                break
            held.append(data["episode_uuid"])
        eq(branch, "retry_2s", f"claim branch after {len(held)} claims ({data})")
        eq(data["episode_uuid"], "", "episode_uuid")
        eq(data["client_uuid"], c4.client_uuid, "client_uuid")
        contains(data["fail_cause"], "No available episodes to claim.", "fail_cause")
    with check("abort_episode of running episodes: 200 success true, slots free again"):
        for ep in held:
            eq(c4.abort_episode(ep), "aborted", f"abort {ep}")
        eq(ow.fetch_pool()["running_episode_details"], None, "running_episode_details")

    with check("finish the batch (t0 x2, t1 x2 with throttle, chats): counts move, then a sync step +1",
               critical=True):
        g0 = c1.http.get("/get_engine_status").expect_ok(ENGINE_STATUS)["global_step"]
        claim = c1.claim("t0")
        c1.chat_completion(claim)
        eq(c1.end_episode("t0", claim["episode_uuid"], workflow_output(0.0, "t0", False)), "ended", "end t0 #2")
        info = ow.fetch_pool()
        eq(info["completed_tasks"], 1, "completed_tasks after t0 x2")
        eq(info["completed_non_dummy_tasks"], 1, "completed_non_dummy_tasks after t0 rewards 1.0, 0.0")
        eq(info["completed_tasks_rewards"].get("t0"), [1.0, 0.0], "completed_tasks_rewards[t0]")
        eq(len(info["completed_tasks_details"].get("t0", [])), 2, "completed_tasks_details[t0] length")
        claims = [c2.claim("t1"), c2.claim("t1")]
        for cl in claims:
            c2.chat_completion(cl)
        eq(c2.end_episode("t1", claims[0]["episode_uuid"], workflow_output(1.0, "t1")), "ended", "end t1 #1")
        eq(c2.end_episode("t1", claims[1]["episode_uuid"], workflow_output(1.0, "t1")), "ended", "end t1 #2")
        st, seen = wait_step(c1.http, g0)
        eq(st["global_step"], g0 + 1, "global_step after the sync")
    with check("pool information in the next batch: only the list-reward episode's task (incomplete) carried over"):
        info = ow.fetch_pool()
        eq(info["completed_episodes"], 1, "completed_episodes")
        eq(list(info["completed_tasks_details"]), ["tlist"], "completed_tasks_details")
        eq(info["engine_status"], ROLLING, "engine_status")
    with check("overwatch: get_verbose_logs non-empty after the state changes"):
        entries = ow.verbose_logs()
        assert entries, "no entries"
        assert all(abs(time.time() - e["timestamp"]) < 3600 for e in entries), "timestamps are not unix seconds"
    with check("client: stop_engine -> success true, then ENGINE.OFFLINE"):
        assert c1.stop_engine() is not None, "stop_engine not sent (cached status already OFFLINE)"
        eq(c1.status(), OFFLINE, "engine_status")
    with check("get_server_experiment_dir after stop_engine: still an absolute path"):
        d = c1.server_experiment_dir()
        assert isinstance(d, str) and os.path.isabs(d), f"server_experiment_dir {d!r}"


def scenario_weight_syncing(base, ow):
    """A late end during WEIGHT_SYNCING (flat config, mock_train_seconds 2 so the state lasts)."""
    c1 = SimSwarmClient(base)
    c2 = SimSwarmClient(base)
    with check("flat config (batch 1 x 1, mock_train_seconds 2), start_engine, ROLLING", critical=True):
        c1.sync_train_config("model: m\nbatch_size: 1\nnum_repeat: 1\nmock_train_seconds: 2\n")
        c1.start_engine()
    ea, eb = c1.claim(), c1.claim()
    g0 = c1.http.get("/get_engine_status").expect_ok(ENGINE_STATUS)["global_step"]
    with check("batch complete with one episode still running: ENGINE.ROLLING_POST", critical=True):
        c1.chat_completion(ea)
        eq(c1.end_episode("t0", ea["episode_uuid"], workflow_output(1.0, "t0")), "ended", "end branch")
        eq(c1.status(), ROLLING_POST, "engine_status")
    with check("claim in ROLLING_POST (stale cached ROLLING): 'Engine is in post-rolling phase' -> quiet 15 s retry"):
        branch, data, _ = c2.begin_episode_attempt(cached_status=ROLLING)
        eq(branch, "retry_quiet_15s", f"claim branch ({data})")
        eq(data["episode_uuid"], "", "episode_uuid")
    with check("can_continue_episode in ROLLING_POST for the running episode: true"):
        eq(c1.can_continue_episode(eb["episode_uuid"]), True, "can_continue")
    with check("abort of the last running episode in ROLLING_POST: success; engine moves to WEIGHT_SYNCING",
               critical=True):
        eq(c1.abort_episode(eb["episode_uuid"]), "aborted", "abort branch")
        eq(c1.status(), WEIGHT_SYNCING, "engine_status")
    with check("claim in WEIGHT_SYNCING (stale cached ROLLING): 'Engine is syncing weights' -> quiet 15 s retry"):
        branch, data, _ = c2.begin_episode_attempt(cached_status=ROLLING)
        eq(branch, "retry_quiet_15s", f"claim branch ({data})")
    with check("late end_episode in WEIGHT_SYNCING: 400 with WEIGHT_SYNCING in detail -> the client discards quietly"):
        eq(c1.end_episode("t0", eb["episode_uuid"], workflow_output(1.0, "t0")), "discarded", "end branch")
    with check("overwatch: pool information validates in WEIGHT_SYNCING"):
        ow.fetch_pool()
    with check("back to ROLLING with global_step + 1"):
        st, _ = wait_step(c1.http, g0)
        eq(st["global_step"], g0 + 1, "global_step")
    with check("stop_engine: success, OFFLINE"):
        c1.stop_engine()


def scenario_agree_any(base, ow):
    c1, c2 = SimSwarmClient(base), SimSwarmClient(base)
    with check("any-agree method: sync_train_config + start_engine, ROLLING", critical=True):
        c1.sync_train_config(quick_agentjet(method=ANY_AGREE))
        c2.job_method = ANY_AGREE
        c1.start_engine()
    with check("pool information: sample_collection_method any-agree, no active clients"):
        info = ow.fetch_pool()
        eq(info["sample_collection_method"], ANY_AGREE, "sample_collection_method")
        eq(active_clients(info), {}, "active clients")
    with check("agree_sync_weight before any declared end: success false, 'not in the active list' -> retry 2 s"):
        branch, data = c1.agree_attempt()
        eq(branch, "rejected", f"agree branch ({data})")
        contains(data["failure_reason"], "not in the active list", "failure_reason")
    with check("agree_sync_weight with an empty client_uuid: 400 with detail"):
        eq(c1.agree_attempt(client_uuid="")[0], "error_retry_2s", "agree branch")
        c1.last.expect(400)
    with check("a declared end makes the client active: allowed_sync_weight false, last_activity_at now",
               critical=True):
        claim = c1.claim()
        c1.chat_completion(claim)
        eq(c1.end_episode("t0", claim["episode_uuid"], workflow_output(1.0, "t0")), "ended", "end branch")
        ac = active_clients(ow.fetch_pool())
        assert c1.client_uuid in ac, f"client not active: {ac}"
        eq(ac[c1.client_uuid]["allowed_sync_weight"], False, "allowed_sync_weight")
        assert abs(time.time() - ac[c1.client_uuid]["last_activity_at"]) < 60, ac
    hold = c1.claim()  # keeps ROLLING_POST up until it ends
    g0 = c1.http.get("/get_engine_status").expect_ok(ENGINE_STATUS)["global_step"]
    with check("agree_sync_weight by the active client: success true -> the client waits for ROLLING_POST/WEIGHT_SYNCING",
               critical=True):
        branch, data = c1.agree_attempt()
        eq(branch, "agreed", f"agree branch ({data})")
    with check("pool information right after the agreement: allowed_sync_weight true"):
        info = ow.fetch_pool()
        ac = active_clients(info)
        assert c1.client_uuid in ac, f"client not in active_clients ({info['engine_status']}): {ac}"
        eq(ac[c1.client_uuid]["allowed_sync_weight"], True, "allowed_sync_weight")
    with check("the engine leaves ROLLING for ROLLING_POST or WEIGHT_SYNCING (what the client waits for)"):
        wait_status(c1.http, {ROLLING_POST, WEIGHT_SYNCING}, timeout=15, interval=0.02)
    with check("the held episode ends during the sync (ended, or discarded during WEIGHT_SYNCING)"):
        assert c1.end_episode("t0", hold["episode_uuid"], workflow_output(1.0, "t0")) in ("ended", "discarded"), \
            c1.last
    with check("back to ROLLING with global_step + 1; the active list is empty"):
        st, seen = wait_step(c1.http, g0)
        eq(st["global_step"], g0 + 1, "global_step")
        eq(active_clients(ow.fetch_pool()), {}, "active clients after the sync")
    with check("agree_sync_weight after the sync without a new end: rejected, 'not in the active list'"):
        branch, data = c1.agree_attempt()
        eq(branch, "rejected", f"agree branch ({data})")
        contains(data["failure_reason"], "not in the active list", "failure_reason")
    with check("stop_engine: success, OFFLINE"):
        c1.stop_engine()


def scenario_agree_all(base, ow):
    c1, c2 = SimSwarmClient(base), SimSwarmClient(base)
    with check("all-agree method: sync_train_config + start_engine, ROLLING", critical=True):
        c1.sync_train_config(quick_agentjet(method=ALL_AGREE))
        c2.job_method = ALL_AGREE
        c1.start_engine()
    with check("two clients each end one declared episode: both active", critical=True):
        for cl in (c1, c2):
            claim = cl.claim()
            cl.chat_completion(claim)
            eq(cl.end_episode("t0", claim["episode_uuid"], workflow_output(1.0, "t0")), "ended", "end branch")
        ac = active_clients(ow.fetch_pool())
        assert {c1.client_uuid, c2.client_uuid} <= set(ac), f"active clients {list(ac)}"
    g0 = c1.http.get("/get_engine_status").expect_ok(ENGINE_STATUS)["global_step"]
    with check("one of two agreements: success true but the engine stays ROLLING, global_step unchanged (1.5 s)"):
        eq(c1.agree_attempt()[0], "agreed", "agree branch")
        deadline, seen = time.time() + 1.5, set()
        while time.time() < deadline:
            st = c1.http.get("/get_engine_status").expect_ok(ENGINE_STATUS)
            seen.add((st["engine_status"], st["global_step"]))
            time.sleep(0.05)
        eq(seen, {(ROLLING, g0)}, "statuses while one client agreed")
        ac = active_clients(ow.fetch_pool())
        eq((ac[c1.client_uuid]["allowed_sync_weight"], ac[c2.client_uuid]["allowed_sync_weight"]), (True, False),
           "allowed_sync_weight (c1, c2)")
    with check("the second agreement: success true, the sync runs, global_step + 1, active list empty"):
        eq(c2.agree_attempt()[0], "agreed", "agree branch")
        st, _ = wait_step(c1.http, g0)
        eq(st["global_step"], g0 + 1, "global_step")
        eq(active_clients(ow.fetch_pool()), {}, "active clients after the sync")
    with check("stop_engine: success, OFFLINE"):
        c1.stop_engine()


# ============================================================================ main
def start_server(binary, workdir):
    log_path = os.path.join(workdir, "server.log")
    for attempt in range(5):
        log = open(log_path, "w")
        try:
            proc = subprocess.Popen([binary, "start", "--port", "0", "--log-level", "info"], cwd=workdir,
                                    stdout=log, stderr=subprocess.STDOUT)
        except OSError as e:  # e.g. "Text file busy" while the binary is being linked
            log.close()
            if attempt == 4:
                raise
            print(f"# cannot start {binary} ({e}); retrying", flush=True)
            time.sleep(3)
            continue
        deadline = time.time() + 15
        while time.time() < deadline:
            with open(log_path, errors="replace") as f:
                m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", f.read())
            if m:
                return proc, int(m.group(1)), log_path
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        proc.kill()
        proc.wait()
        raise RuntimeError(f"server exited early or never reported its port; log:\n{open(log_path).read()}")
    raise RuntimeError("unreachable")


def main():
    if len(sys.argv) != 2:
        print("usage: conformance.py <path-to-swarm-server>", file=sys.stderr)
        return 2
    binary = os.path.abspath(sys.argv[1])
    workdir = tempfile.mkdtemp(prefix="agentjet-conformance-")
    proc, log_path = None, None
    t_start = time.time()
    try:
        with check("swarm-server starts on --port 0 and reports its port", critical=True):
            proc, port, log_path = start_server(binary, workdir)
        base = f"http://127.0.0.1:{port}"
        ow = Overwatch(base)
        poller = StatusPoller(base)
        poller.start()
        scenarios = [("fresh server (OFFLINE)", lambda: scenario_fresh_server(base, ow)),
                     ("sync_train_config", lambda: scenario_sync_train_config(base)),
                     ("sync_train_code", lambda: scenario_sync_train_code(base)),
                     ("client session: tasks method, throttle policy", lambda: scenario_client_session(base, ow)),
                     ("late end during WEIGHT_SYNCING", lambda: scenario_weight_syncing(base, ow)),
                     ("agree: any client", lambda: scenario_agree_any(base, ow)),
                     ("agree: all clients", lambda: scenario_agree_all(base, ow))]
        for title, run in scenarios:
            print(f"# {title}", flush=True)
            try:
                run()
            except ScenarioAborted as e:
                print(f"# scenario '{title}' stopped after {e} failed", flush=True)
            except Exception as e:  # noqa: BLE001 (an error outside any check)
                R.failed.append(title)
                print(f"FAIL {title}: {type(e).__name__}: {e}", flush=True)
            finally:
                ensure_offline(base)
        poller.stop_event.set()
        poller.join(5)
        with check(f"status poller: {poller.polls} polls, every answer 200 with a known engine_status"):
            assert not poller.errors, f"{len(poller.errors)} failed polls, first: {poller.errors[0]}"
            assert poller.polls > 0, "no polls"
        with check("the server is still running"):
            assert proc.poll() is None, f"server exited with {proc.returncode}"
    except ScenarioAborted:
        pass
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if R.failed and log_path and os.path.exists(log_path):
            tail = open(log_path, errors="replace").read().splitlines()[-40:]
            print("# server log (last 40 lines):\n" + "\n".join("#   " + line for line in tail))
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"# {R.passed} ok, {len(R.failed)} failed, {R.skipped} skipped in {time.time() - t_start:.1f}s")
    return 1 if R.failed else 0


if __name__ == "__main__":
    sys.exit(main())
