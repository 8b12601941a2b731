// The real agent harnesses against claimed episodes.
//
// Usage: node tests/harness/harnesses.mjs <path-to-swarm-server> [--torch <path-to-swarm-model>]
//
// Starts `swarm-server start --port 0` (the mock engine unless told otherwise), syncs a job
// whose batch is every episode below (record_samples on), and runs, each on a fresh claimed
// episode in its own temporary directory:
//   * Claude Code 2.1 in print mode (`claude -p --bare --tools Bash --allowedTools Bash
//     --system-prompt ... --model ...`, ANTHROPIC_BASE_URL = the claim's anthropic_base_url,
//     ANTHROPIC_API_KEY = the episode key, telemetry / non-essential traffic / auto-update off);
//   * the Claude Agent SDK 0.3 `query()` with a Bash tool (same environment);
//   * Codex 0.169 `codex exec` with a provider whose wire_api is "responses" and a slim config
//     (web search, analytics, feedback, telemetry, update check and plugins off), stdin
//     /dev/null, --skip-git-repo-check.
// Each harness runs twice: a text run (the mock answers with the prompt, the harness prints it)
// and a tool run (the prompt holds a `<tool_call>` for the harness's shell tool, which the mock
// echoes as the model's call: Bash `echo 42` / exec_command `echo 42`; the harness runs it and
// sends the result back; the mock answers with that result, which holds 42). After the policy
// step, <experiment>/samples.jsonl must hold one sample per episode: 1 call for a text run, 2
// for a tool run (the harness's resent assistant turn spliced onto the generated ids).
//
// On the torch engine (`--torch <swarm-model>`: a random tiny Qwen3 made by `swarm-model init`
// from tests/data/tiny-qwen3 + Qwen3's tokenizer and template) only Claude Code's text run is
// made: a random model's words are not checked, only that the harness completes a turn against
// it and the episode trains as one sample.
//
// Prints `ok <name>` or `FAIL <name>: why`; exits 1 if any failed, 77 (ctest skip) when the
// harness packages are not installed (scripts/setup.sh; SWARM_SKIP_HARNESSES=1 skips them).

import { execFileSync, spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { SwarmServer, assert, sleep, withTimeout } from '../js/swarm_server.mjs';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const RUN_TIMEOUT_MS = 180_000;

const args = process.argv.slice(2);
const serverBin = args[0] && path.resolve(args[0]);
const opt = name => { const i = args.indexOf(name); return i >= 0 ? args[i + 1] : undefined; };
const modelBin = opt('--torch') && path.resolve(opt('--torch'));
const engine = modelBin ? 'torch' : 'mock';
if (!serverBin) {
  console.error('usage: node harnesses.mjs <swarm-server> [--torch <swarm-model>]');
  process.exit(2);
}
const ROOT = path.resolve(HERE, '../..');
const CLAUDE = path.join(HERE, 'node_modules/@anthropic-ai/claude-code/bin/claude.exe');
const CODEX = path.join(HERE, 'node_modules/@openai/codex/bin/codex.js');
const SDK = path.join(HERE, 'node_modules/@anthropic-ai/claude-agent-sdk/package.json');
const missing = [CLAUDE, CODEX, SDK].filter(f => !fs.existsSync(f));
if (missing.length) {
  console.log(`skip: not installed: ${missing.map(f => path.relative(HERE, f)).join(', ')} (run scripts/setup.sh)`);
  process.exit(77);
}
const { query } = await import('@anthropic-ai/claude-agent-sdk');

const CLAUDE_ENV = {
  DISABLE_TELEMETRY: '1', CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1', DISABLE_AUTOUPDATER: '1',
  CLAUDE_CODE_MAX_RETRIES: '1',
};
const bashCall = '<tool_call>{"name": "Bash", "arguments": {"command": "echo 42"}}</tool_call>';
const execCall = '<tool_call>{"name": "exec_command", "arguments": {"cmd": "echo 42"}}</tool_call>';

// Runs a command to its end; resolves {code, stdout, stderr}.
function run(cmd, argv, { env, cwd }) {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, argv, { env: { ...process.env, ...env }, cwd, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '', stderr = '';
    child.stdout.on('data', d => { stdout += d; });
    child.stderr.on('data', d => { stderr += d; });
    child.on('error', reject);
    child.on('close', code => resolve({ code, stdout, stderr }));
    setTimeout(() => child.kill('SIGKILL'), RUN_TIMEOUT_MS - 5_000).unref();
  });
}

const tail = s => s.trim().split('\n').slice(-15).join('\n');

async function claudeCode(claim, prompt, dir) {
  const r = await run(CLAUDE, ['-p', prompt, '--bare', '--tools', 'Bash', '--allowedTools', 'Bash', '--system-prompt',
    'You are a test agent.', '--model', 'swarm-test', '--output-format', 'json'], {
    cwd: dir,
    env: { ...CLAUDE_ENV, HOME: dir, ANTHROPIC_BASE_URL: claim.anthropic_base_url, ANTHROPIC_API_KEY: claim.openai_api_key },
  });
  assert(r.code === 0, `claude exited ${r.code}\nstdout: ${r.stdout.slice(-3000)}\nstderr: ${tail(r.stderr)}`);
  const out = JSON.parse(r.stdout.trim().split('\n').pop());
  assert(!out.is_error, `claude reported an error: ${r.stdout}`);
  return { text: out.result, turns: out.num_turns };
}

async function agentSdk(claim, prompt, dir) {
  let result = null, toolResults = 0;
  const options = {
    env: { ...process.env, ...CLAUDE_ENV, HOME: dir, ANTHROPIC_BASE_URL: claim.anthropic_base_url, ANTHROPIC_API_KEY: claim.openai_api_key },
    tools: ['Bash'], allowedTools: ['Bash'], systemPrompt: 'You are a test agent.', model: 'swarm-test',
    settingSources: [], cwd: dir,
  };
  for await (const m of query({ prompt, options })) {
    if (m.type === 'user' && Array.isArray(m.message?.content))
      toolResults += m.message.content.filter(b => b.type === 'tool_result').length;
    if (m.type === 'result') result = m;
  }
  assert(result && !result.is_error, `query() ended with ${JSON.stringify(result)}`);
  return { text: result.result, toolResults };
}

async function codex(claim, prompt, dir) {
  const home = path.join(dir, 'codex-home');
  fs.mkdirSync(home, { recursive: true });
  fs.writeFileSync(path.join(home, 'config.toml'), [
    'model = "swarm-test"', 'model_provider = "swarm"', 'approval_policy = "never"', 'sandbox_mode = "danger-full-access"',
    'check_for_update_on_startup = false', 'web_search = "disabled"', '',
    '[analytics]', 'enabled = false', '', '[feedback]', 'enabled = false', '', '[otel]', 'exporter = "none"', '',
    '[model_providers.swarm]', 'name = "swarm"', `base_url = "${claim.openai_base_url}"`, 'wire_api = "responses"',
    'env_key = "SWARM_API_KEY"', 'request_max_retries = 1', 'stream_max_retries = 1', '',
  ].join('\n'));
  const r = await run(process.execPath, [CODEX, 'exec', '--skip-git-repo-check', '--strict-config', '--disable', 'plugins',
    '--json', prompt], { cwd: dir, env: { CODEX_HOME: home, SWARM_API_KEY: claim.openai_api_key, HOME: dir } });
  assert(r.code === 0, `codex exited ${r.code}\nstdout: ${tail(r.stdout)}\nstderr: ${tail(r.stderr)}`);
  const events = r.stdout.trim().split('\n').filter(l => l.startsWith('{')).map(l => JSON.parse(l));
  const items = events.filter(e => e.type === 'item.completed').map(e => e.item);
  const message = items.filter(i => i.type === 'agent_message').pop();
  assert(message, `codex printed no agent message: ${tail(r.stdout)}`);
  return { text: message.text, commands: items.filter(i => i.type === 'command_execution') };
}

// A random model never ends its turn by itself (151k tokens, one of them <|im_end|>), and
// Claude Code treats an answer cut by max_tokens as a failed turn. So the random weights get
// one change: every embedding's first component is 10 (it dominates the residual stream, so the
// final hidden state always points the same way there) and <|im_end|>'s is 11.3 (the embeddings
// are tied: its logit is ~10 above the rest), so at temperature 1 a turn ends after a few random
// tokens (about 1 in 5 per step).
function endsItsTurns(dir) {
  const file = path.join(dir, 'model.safetensors');
  const buf = fs.readFileSync(file);
  const headerLen = Number(buf.readBigUInt64LE(0));
  const header = JSON.parse(buf.subarray(8, 8 + headerLen).toString('utf8'));
  const t = header['model.embed_tokens.weight'];
  assert(t && t.dtype === 'F32', 'model.embed_tokens.weight (F32) not found');
  const [rows, cols] = t.shape;
  const base = 8 + headerLen + t.data_offsets[0];
  for (let r = 0; r < rows; r++) buf.writeFloatLE(r === 151645 ? 11.3 : 10, base + 4 * r * cols);
  fs.writeFileSync(file, buf);
}

const CASES = engine === 'torch'
  ? [{ name: 'Claude Code text run (torch engine, random model)', harness: claudeCode, prompt: 'Say hello.', calls: 1,
    // An answer that is <|im_end|> at once (1 in 5) is an empty message, which Claude Code asks
    // again for: then the episode holds one sample per call.
    anySamples: true, check: r => assert(typeof r.text === 'string' && r.turns >= 1, `result ${JSON.stringify(r)}`) }]
  : [
    { name: 'Claude Code text run', harness: claudeCode, prompt: 'Reply with: hello harness', calls: 1,
      check: r => assert(r.text.includes('hello harness'), `result ${JSON.stringify(r.text)}`) },
    { name: 'Claude Code Bash tool run', harness: claudeCode, prompt: bashCall, calls: 2,
      check: r => assert(r.text.trim() === '42' && r.turns >= 2, `result ${JSON.stringify(r)}`) },
    { name: 'Claude Agent SDK text run', harness: agentSdk, prompt: 'Reply with: hello sdk', calls: 1,
      check: r => assert(r.text.includes('hello sdk'), `result ${JSON.stringify(r.text)}`) },
    { name: 'Claude Agent SDK Bash tool run', harness: agentSdk, prompt: bashCall, calls: 2,
      check: r => assert(r.text.trim() === '42' && r.toolResults === 1, `result ${JSON.stringify(r)}`) },
    { name: 'Codex text run', harness: codex, prompt: 'Reply with: hello codex', calls: 1,
      check: r => assert(r.text.includes('hello codex'), `message ${JSON.stringify(r.text)}`) },
    { name: 'Codex exec_command tool run', harness: codex, prompt: execCall, calls: 2,
      check: r => assert(r.commands.length === 1 && r.text.includes('42'), `message ${JSON.stringify(r)}`) },
  ];

const server = new SwarmServer(serverBin, 'swarm-harness-', engine === 'torch' ? ['--engine', 'torch'] : []);
let failed = 0;
const done = [];
try {
  await server.start();
  const exp = path.join(server.workdir, 'exp');
  let modelDir = null;
  if (engine === 'torch') {
    const src = path.join(server.workdir, 'src');
    modelDir = path.join(server.workdir, 'model');
    fs.mkdirSync(src);
    for (const f of ['config.json', 'generation_config.json']) fs.copyFileSync(path.join(ROOT, 'tests/data/tiny-qwen3', f), path.join(src, f));
    for (const f of ['tokenizer.json', 'tokenizer_config.json']) fs.copyFileSync(path.join(ROOT, 'tests/fixtures/tokenizers/qwen3', f), path.join(src, f));
    execFileSync(modelBin, ['init', '--from', src, '--out', modelDir, '--dtype', 'f32', '--seed', '3'], { stdio: 'ignore' });
    endsItsTurns(modelDir);
  }
  await server.startEngine([
    `model: ${engine === 'torch' ? modelDir : 'mock'}`, `batch_size: ${CASES.length}`, 'num_repeat: 1',
    'max_parallel_episodes: 4', `temperature: ${engine === 'torch' ? 1 : 0}`, `max_prompt_length: ${engine === 'torch' ? 4000 : 60000}`,
    `max_response_length: ${engine === 'torch' ? 96 : 8192}`, 'record_samples: true', `experiment_dir: ${exp}`,
    'project_name: p', 'experiment_name: e', '',
  ].join('\n'), 120_000);
  for (const c of CASES) {
    const claim = await server.post('/claim_episode', { client_uuid: 'harness', discard_episode_timeout: 600 });
    assert(claim.success && claim.anthropic_base_url, `claim_episode: ${JSON.stringify(claim)}`);
    const dir = fs.mkdtempSync(path.join(server.workdir, 'run-'));
    try {
      const r = await withTimeout(c.harness(claim, c.prompt, dir), RUN_TIMEOUT_MS);
      c.check(r);
      await server.post('/end_episode', { client_uuid: 'harness', episode_uuid: claim.episode_uuid,
        task_id: `task-${done.length}`, workflow_output: { reward: 1 } });
      done.push({ c, episode: claim.episode_uuid });
    } catch (e) {
      failed++;
      console.log(`FAIL ${c.name}: ${e?.stack ?? e}\nserver log:\n${server.logTail(20)}`);
      await server.post('/abort_episode', { client_uuid: 'harness', episode_uuid: claim.episode_uuid }).catch(() => {});
    }
  }
  if (done.length === CASES.length) {
    for (const until = Date.now() + 120_000; (await server.status()).global_step < 1;) {
      assert(Date.now() < until, 'no policy step within 120 s');
      await sleep(200);
    }
    const lines = fs.readFileSync(path.join(exp, 'p', 'e', 'samples.jsonl'), 'utf8').trim().split('\n').map(l => JSON.parse(l));
    for (const { c, episode } of done) {
      const mine = lines.filter(s => s.episode_uuid === episode);
      if ((mine.length === 1 || (c.anySamples && mine.length > 1)) && mine.every(s => s.num_calls === c.calls)) {
        console.log(`ok ${c.name}: one sample of ${mine[0].token_ids.length} tokens, ${c.calls} call(s)`);
      } else {
        failed++;
        console.log(`FAIL ${c.name}: ${mine.length} sample(s) with ${mine.map(s => s.num_calls).join(', ')} call(s), expected one of ${c.calls}`);
      }
    }
  }
} catch (e) {
  failed++;
  console.log(`FAIL setup: ${e?.stack ?? e}\nserver log:\n${server.logTail()}`);
}
process.exit(failed ? 1 : 0);
