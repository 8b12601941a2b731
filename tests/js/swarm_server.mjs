// A swarm-server child process for the Node tests (tool_loops.mjs, exact_tokens.mjs): started
// with `--port 0` in a temporary directory, killed (and the directory removed) at exit.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

export const sleep = ms => new Promise(r => setTimeout(r, ms));

export function assert(cond, msg) {
  if (!cond) throw new Error(msg);
}

export class SwarmServer {
  constructor(binary, prefix, args = []) {
    this.binary = binary;
    this.args = args;  // more `start` options, e.g. ['--engine', 'torch']
    this.workdir = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
    this.logPath = path.join(this.workdir, 'server.log');
    this.child = null;
    this.base = null;
    process.on('exit', () => this.cleanup());
    for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) process.on(sig, () => process.exit(1));
  }

  cleanup() {
    const c = this.child;
    if (c && c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
    this.child = null;
    try { fs.rmSync(this.workdir, { recursive: true, force: true }); } catch { /* best effort */ }
  }

  async start() {
    const log = fs.openSync(this.logPath, 'w');
    this.child = spawn(this.binary, ['start', '--port', '0', '--log-level', 'info', ...this.args],
      { cwd: this.workdir, stdio: ['ignore', log, log] });
    fs.closeSync(log);
    let spawnError = null;
    this.child.on('error', e => { spawnError = e; });
    for (let i = 0; i < 200; i++) {
      const m = fs.readFileSync(this.logPath, 'utf8').match(/listening on (https?):\/\/127\.0\.0\.1:(\d+)/);
      if (m) return (this.base = `${m[1]}://127.0.0.1:${m[2]}`);
      if (spawnError) throw new Error(`cannot start ${this.binary}: ${spawnError.message}`);
      if (this.child.exitCode !== null || this.child.signalCode !== null) break;
      await sleep(50);
    }
    throw new Error(`server exited early or never reported its port; log:\n${this.logTail()}`);
  }

  logTail(lines = 40) {
    return fs.existsSync(this.logPath) ? fs.readFileSync(this.logPath, 'utf8').split('\n').slice(-lines).join('\n') : '';
  }

  async post(route, body) {
    const res = await fetch(this.base + route, {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
    });
    const text = await res.text();
    if (!res.ok) throw new Error(`POST ${route}: HTTP ${res.status} ${text}`);
    return JSON.parse(text);
  }

  async status() {
    return (await fetch(this.base + '/get_engine_status')).json();
  }

  // Syncs the job config and waits for ENGINE.ROLLING (booting a torch model takes a while).
  async startEngine(yaml, timeoutMs = 60_000) {
    await this.post('/sync_train_config', { yaml_as_string: yaml });
    await this.post('/start_engine', {});
    for (const until = Date.now() + timeoutMs; Date.now() < until;) {
      const st = await this.status();
      if (st.engine_status === 'ENGINE.ROLLING') return;
      await sleep(100);
    }
    throw new Error(`engine never reached ENGINE.ROLLING; log:\n${this.logTail()}`);
  }
}

export function withTimeout(promise, ms) {
  let timer;
  return Promise.race([
    promise,
    new Promise((_, reject) => { timer = setTimeout(() => reject(new Error(`timed out after ${ms / 1000} s`)), ms); }),
  ]).finally(() => clearTimeout(timer));
}

// A fetch that keeps every chat request body (handed to a framework or its OpenAI client), so a
// test can check what went over the wire.
export function bodyRecorder() {
  const bodies = [];
  const wrapped = async (url, init) => {
    const u = typeof url === 'string' ? url : url.url ?? String(url);
    if (u.endsWith('/chat/completions') && typeof init?.body === 'string') bodies.push(JSON.parse(init.body));
    return fetch(url, init);
  };
  return { fetch: wrapped, bodies };
}
