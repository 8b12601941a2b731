// Exact tokens across turns, on the torch engine, driven by real agent frameworks.
//
// Usage: node tests/js/exact_tokens.mjs <swarm-server> <swarm-model> <cache-dir>
//
// 1. A tiny Qwen3-architecture model (tests/data/tiny-qwen3 + Qwen3's tokenizer and chat
//    template) is created with `swarm-model init` and taught one conversation by
//    tests/reference/train_tool_caller.py: asked "What is (2+3)*4?" with the tools add and mul,
//    it calls add(2, 3), then mul(5, 4), then answers "(2+3)*4 = 20". The token sequence it is
//    taught is built here from `swarm-model render-chat` / `tokenize`, independently of the
//    server's splicing: the first prompt, each generated turn (ending in <|im_end|>), and after
//    each tool call what Qwen3's template renders for the tool result (found by rendering a
//    marker in the assistant turn's place and taking the text after it, less the <|im_end|>
//    the model generated). Cached in <cache-dir> (keyed by a hash of every input).
// 2. `swarm-server --engine torch` serves it (record_samples: true). The official `openai` SDK
//    (manual loop) and LangChain (`ChatOpenAI.bindTools`, which re-serializes the arguments
//    with JSON.stringify) each run the three-turn tool loop in a claimed episode; a fetch
//    wrapper asks for `return_token_ids` and keeps every request and response.
// 3. After the policy step, <experiment>/samples.jsonl must hold one sample per episode whose
//    ids are, token by token, the taught sequence, with loss mask 1 exactly on the three
//    generated turns; each prompt the server used must continue the previous prompt +
//    completion; LangChain's re-serialized history must render afresh to other ids (so the
//    test would fail without the splice); no episode is split by drift.
//
// Prints `ok <name>` / `FAIL <name>: why`; exits 1 on failure, 77 (ctest skip) when the
// framework packages or /usr/bin/python3 with torch are missing.

import { execFileSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { SwarmServer, assert, sleep, withTimeout } from './swarm_server.mjs';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.resolve(HERE, '..', '..');
const PYTHON = '/usr/bin/python3';
const IM_END = 151645;

const [serverBin, modelBin, cacheDir] = process.argv.slice(2).map(p => p && path.resolve(p));
if (!serverBin || !modelBin || !cacheDir) {
  console.error('usage: node exact_tokens.mjs <swarm-server> <swarm-model> <cache-dir>');
  process.exit(2);
}
const missing = ['openai', '@langchain/openai', '@langchain/core']
  .filter(p => !fs.existsSync(path.join(HERE, 'node_modules', p, 'package.json')));
if (missing.length) {
  console.log(`skip: ${missing.join(', ')} not installed in ${HERE}/node_modules (run scripts/setup.sh)`);
  process.exit(77);
}
try {
  execFileSync(PYTHON, ['-c', 'import torch, numpy'], { stdio: 'ignore' });
} catch {
  console.log(`skip: ${PYTHON} with torch and numpy is needed to teach the model (run scripts/setup.sh)`);
  process.exit(77);
}
const { default: OpenAI } = await import('openai');
const { ChatOpenAI } = await import('@langchain/openai');
const { HumanMessage, ToolMessage } = await import('@langchain/core/messages');

// ------------------------------------------------------------------------------ the conversation
const QUESTION = 'What is (2+3)*4? Use the tools.';
const params = { type: 'object', properties: { a: { type: 'integer' }, b: { type: 'integer' } }, required: ['a', 'b'] };
const TOOLS = [
  { type: 'function', function: { name: 'add', description: 'Add two integers.', parameters: params } },
  { type: 'function', function: { name: 'mul', description: 'Multiply two integers.', parameters: params } },
];
const RUN = { add: ({ a, b }) => String(a + b), mul: ({ a, b }) => String(a * b) };
// What the model is taught to generate, turn by turn (Qwen3's tool-call format).
const TURNS = [
  '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>',
  '<tool_call>\n{"name": "mul", "arguments": {"a": 5, "b": 4}}\n</tool_call>',
  '(2+3)*4 = 20',
];
const RESULTS = ['5', '20'];
const FINAL = '(2+3)*4 = 20';

// ------------------------------------------------------------------------------ the model
function run(bin, args, input) {
  return execFileSync(bin, args, { input, encoding: 'utf8', maxBuffer: 64 << 20 });
}
function renderChat(modelDir, messages, addGenerationPrompt = true) {
  const file = path.join(cacheDir, `render-${process.pid}.json`);
  fs.writeFileSync(file, JSON.stringify({ messages, tools: TOOLS, add_generation_prompt: addGenerationPrompt }));
  try {
    return JSON.parse(run(modelBin, ['render-chat', '--model', modelDir, file]));
  } finally {
    fs.rmSync(file, { force: true });
  }
}
function tokenize(modelDir, text) {
  return JSON.parse(run(modelBin, ['tokenize', '--model', modelDir, '--no-special'], text));
}

// The taught sequence: first prompt, then per turn the generated ids and the tool result.
function conversation(modelDir) {
  const first = [{ role: 'user', content: QUESTION }];
  const seq = [...renderChat(modelDir, first).ids];
  const turns = [];
  for (let t = 0; t < TURNS.length; t++) {
    const ids = [...tokenize(modelDir, TURNS[t]), IM_END];
    turns.push([seq.length, seq.length + ids.length]);
    seq.push(...ids);
    if (t === RESULTS.length) break;
    const MARK = 'MARKER-7f3a';
    const text = renderChat(modelDir, [...first, { role: 'assistant', content: MARK },
      { role: 'tool', tool_call_id: 'call_0', content: RESULTS[t] }]).prompt;
    let after = text.slice(text.indexOf(MARK) + MARK.length);
    assert(after.startsWith('<|im_end|>'), `unexpected end of an assistant turn: ${JSON.stringify(after.slice(0, 40))}`);
    after = after.slice('<|im_end|>'.length);
    seq.push(...tokenize(modelDir, after));
  }
  return { seq, turns };
}

function teach() {
  const inputs = ['tests/data/tiny-qwen3/config.json', 'tests/data/tiny-qwen3/generation_config.json',
    'tests/fixtures/tokenizers/qwen3/tokenizer.json', 'tests/fixtures/tokenizers/qwen3/tokenizer_config.json',
    'tests/reference/train_tool_caller.py', 'tests/reference/llama_reference.py', 'tests/js/exact_tokens.mjs'];
  const h = crypto.createHash('sha256');
  for (const f of inputs) h.update(fs.readFileSync(path.join(ROOT, f)));
  const dir = path.join(cacheDir, `tool-caller-qwen3-${h.digest('hex').slice(0, 16)}`);
  if (fs.existsSync(path.join(dir, 'taught.json'))) return { dir, ...JSON.parse(fs.readFileSync(path.join(dir, 'taught.json'), 'utf8')) };
  fs.mkdirSync(cacheDir, { recursive: true });
  const src = fs.mkdtempSync(path.join(cacheDir, 'src-'));
  const tmp = `${dir}.tmp-${process.pid}`;
  fs.rmSync(tmp, { recursive: true, force: true });
  try {
    for (const f of ['config.json', 'generation_config.json'])
      fs.copyFileSync(path.join(ROOT, 'tests/data/tiny-qwen3', f), path.join(src, f));
    for (const f of ['tokenizer.json', 'tokenizer_config.json'])
      fs.copyFileSync(path.join(ROOT, 'tests/fixtures/tokenizers/qwen3', f), path.join(src, f));
    run(modelBin, ['init', '--from', src, '--out', tmp, '--dtype', 'f32', '--seed', '1']);
    const { seq, turns } = conversation(tmp);
    const t0 = Date.now();
    const report = JSON.parse(run(PYTHON, [path.join(ROOT, 'tests/reference/train_tool_caller.py')],
      JSON.stringify({ model_dir: tmp, sequence: seq, targets: turns, max_steps: 1500, lr: 0.003, margin: 4.0, seed: 1 })));
    console.log(`taught the model in ${report.steps} steps (${((Date.now() - t0) / 1000).toFixed(1)} s), ` +
      `loss ${report.loss.toFixed(4)}, smallest margin ${report.min_margin.toFixed(2)} logits`);
    fs.writeFileSync(path.join(tmp, 'taught.json'), JSON.stringify({ seq, turns }));
    fs.rmSync(dir, { recursive: true, force: true });
    fs.renameSync(tmp, dir);
  } finally {
    fs.rmSync(src, { recursive: true, force: true });
    fs.rmSync(tmp, { recursive: true, force: true });
  }
  return { dir, ...JSON.parse(fs.readFileSync(path.join(dir, 'taught.json'), 'utf8')) };
}

// ------------------------------------------------------------------------------ the clients
// Asks for the prompt / completion ids and keeps every chat request and response.
function recorder() {
  const calls = [];
  const wrapped = async (url, init) => {
    const u = typeof url === 'string' ? url : url.url ?? String(url);
    if (!u.endsWith('/chat/completions') || typeof init?.body !== 'string') return fetch(url, init);
    const body = JSON.parse(init.body);
    body.return_token_ids = true;
    const res = await fetch(url, { ...init, body: JSON.stringify(body) });
    const text = await res.text();
    calls.push({ request: body, response: res.ok ? JSON.parse(text) : text });
    return new Response(text, { status: res.status, headers: res.headers });
  };
  return { fetch: wrapped, calls };
}

async function openaiLoop({ baseURL, apiKey }, rec) {
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, fetch: rec.fetch });
  const messages = [{ role: 'user', content: QUESTION }];
  for (let turn = 0; turn < 4; turn++) {
    const r = await client.chat.completions.create({ model: 'm', temperature: 0, messages, tools: TOOLS });
    const msg = r.choices[0].message;
    if (!msg.tool_calls?.length) return msg.content;
    messages.push(msg);
    for (const c of msg.tool_calls)
      messages.push({ role: 'tool', tool_call_id: c.id, content: RUN[c.function.name](JSON.parse(c.function.arguments)) });
  }
  throw new Error('no final answer after 4 turns');
}

async function langchainLoop({ baseURL, apiKey }, rec) {
  const model = new ChatOpenAI({ model: 'm', apiKey, temperature: 0, maxRetries: 0,
    configuration: { baseURL, fetch: rec.fetch } }).bindTools(TOOLS);
  const messages = [new HumanMessage(QUESTION)];
  for (let turn = 0; turn < 4; turn++) {
    const ai = await model.invoke(messages);
    if (!ai.tool_calls?.length) return ai.content;
    messages.push(ai);
    for (const c of ai.tool_calls) messages.push(new ToolMessage({ content: RUN[c.name](c.args), tool_call_id: c.id }));
  }
  throw new Error('no final answer after 4 turns');
}

// ------------------------------------------------------------------------------ checks
function same(a, b) {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}
function firstDifference(a, b) {
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) i++;
  return i;
}

function checkEpisode(name, taught, rec, sample, modelDir) {
  const { seq, turns } = taught;
  assert(rec.calls.length === 3, `${name}: ${rec.calls.length} chat requests, expected 3`);
  // Each prompt continues the previous prompt + completion.
  for (let i = 0; i < 3; i++) {
    const r = rec.calls[i].response;
    assert(typeof r === 'object', `${name}: request ${i + 1} failed: ${r}`);
    const prompt = r.prompt_token_ids;
    const completion = r.choices[0].token_ids;
    assert(same(completion, seq.slice(...turns[i])),
      `${name}: turn ${i + 1} generated ${JSON.stringify(completion)}, taught ${JSON.stringify(seq.slice(...turns[i]))}`);
    assert(same(prompt, seq.slice(0, turns[i][0])),
      `${name}: prompt ${i + 1} differs from the taught sequence at token ${firstDifference(prompt, seq)}`);
    if (i > 0) {
      const prev = rec.calls[i - 1].response;
      const before = [...prev.prompt_token_ids, ...prev.choices[0].token_ids];
      assert(same(prompt.slice(0, before.length), before), `${name}: prompt ${i + 1} does not continue turn ${i}`);
    }
  }
  // The sample: the taught sequence token by token, loss mask 1 exactly on generated turns.
  assert(sample, `${name}: no sample in samples.jsonl`);
  assert(sample.num_calls === 3, `${name}: the sample merges ${sample.num_calls} calls, expected 3`);
  assert(same(sample.token_ids, seq), `${name}: sample ids differ from the taught sequence at token ` +
    `${firstDifference(sample.token_ids, seq)} (${sample.token_ids.length} vs ${seq.length} tokens)`);
  const generated = new Set(turns.flatMap(([b, e]) => Array.from({ length: e - b }, (_, k) => b + k)));
  sample.loss_mask.forEach((m, i) => assert(m === (generated.has(i) ? 1 : 0), `${name}: loss mask ${m} at token ${i}`));
  // A fresh render of the history this framework sent back (content null read as "", as the
  // server does: Qwen3's template cannot render null).
  const messages = rec.calls[2].request.messages.map(m => (m.content === null ? { ...m, content: '' } : m));
  return same(renderChat(modelDir, messages).ids, rec.calls[2].response.prompt_token_ids);
}

// ------------------------------------------------------------------------------ main
const results = [];
const server = new SwarmServer(serverBin, 'swarm-exact-tokens-', ['--engine', 'torch']);
let failed = 0;
try {
  const taught = teach();
  await server.start();
  const exp = path.join(server.workdir, 'exp');
  await server.startEngine([
    `model: ${taught.dir}`, 'batch_size: 1', 'num_repeat: 2', 'max_prompt_length: 1024', 'max_response_length: 48',
    'temperature: 0', 'record_samples: true', `experiment_dir: ${exp}`, 'project_name: p', 'experiment_name: e', '',
  ].join('\n'), 120_000);
  const loops = [['openai chat.completions tool loop', openaiLoop], ['langchain bindTools tool loop', langchainLoop]];
  for (const [name, loop] of loops) {
    const rec = recorder();
    const claim = await server.post('/claim_episode', { client_uuid: 'js', discard_episode_timeout: 300 });
    assert(claim.success, `claim_episode: ${JSON.stringify(claim)}`);
    try {
      const answer = await withTimeout(loop({ baseURL: claim.openai_base_url, apiKey: claim.openai_api_key }, rec), 120_000);
      assert(answer === FINAL, `${name}: final answer ${JSON.stringify(answer)}, expected ${JSON.stringify(FINAL)}`);
      await server.post('/end_episode', { client_uuid: 'js', episode_uuid: claim.episode_uuid, task_id: 'calc',
        workflow_output: { reward: results.length } });
      results.push({ name, rec, episode: claim.episode_uuid });
    } catch (e) {
      failed++;
      console.log(`FAIL ${name}: ${e?.stack ?? e}`);
      await server.post('/abort_episode', { client_uuid: 'js', episode_uuid: claim.episode_uuid }).catch(() => {});
    }
  }
  if (results.length === loops.length) {
    for (const until = Date.now() + 120_000; (await server.status()).global_step < 1;) {
      assert(Date.now() < until, 'no policy step within 120 s');
      await sleep(200);
    }
    const lines = fs.readFileSync(path.join(exp, 'p', 'e', 'samples.jsonl'), 'utf8').trim().split('\n').map(l => JSON.parse(l));
    for (const { name, rec, episode } of results) {
      try {
        const mine = lines.filter(s => s.episode_uuid === episode);
        assert(mine.length === 1, `${name}: ${mine.length} samples for the episode, expected 1`);
        const freshSame = checkEpisode(name, taught, rec, mine[0], taught.dir);
        if (name.startsWith('langchain')) {
          const sent = rec.calls[1].request.messages.find(m => m.tool_calls)?.tool_calls[0].function.arguments;
          assert(sent === '{"a":2,"b":3}', `${name}: arguments sent back as ${sent}, expected JSON.stringify's form`);
          assert(!freshSame, `${name}: a fresh render of the re-serialized history gives the same ids: the splice is untested`);
        }
        console.log(`ok ${name}: one sample of ${mine[0].token_ids.length} tokens, ${mine[0].loss_mask.filter(Boolean).length} ` +
          `generated${freshSame ? '' : ' (a fresh render of the history would differ)'}`);
      } catch (e) {
        failed++;
        console.log(`FAIL ${name}: ${e?.stack ?? e}`);
      }
    }
    const metrics = await (await fetch(server.base + '/metrics')).text();
    const drift = metrics.match(/swarm_episodes_total\{event="split_by_drift"\} (\d+)/);
    if (!drift || drift[1] !== '0') {
      failed++;
      console.log(`FAIL metrics: split_by_drift ${drift ? drift[1] : 'missing'}`);
    }
  }
} catch (e) {
  failed++;
  console.log(`FAIL setup: ${e?.stack ?? e}`);
}
if (failed) console.log(`${failed} failed; server log tail:\n${server.logTail()}`);
process.exit(failed ? 1 : 0);
