// Agent-framework tool loops against a claimed episode.
//
// Usage: node tests/js/tool_loops.mjs <path-to-swarm-server>
//
// Starts `swarm-server start --port 0` (mock engine) in a temporary directory, syncs a job
// config (batch_size 100, so nothing ever syncs weights), starts the engine and, for each
// test, claims a fresh episode and points a real agent framework at its openai_base_url /
// openai_api_key. The mock engine answers with the last user or tool message, so a user
// message holding `<tool_call>{"name": "add", ...}</tool_call>` makes the "model" call add;
// the framework parses the call (message.tool_calls, or streamed delta.tool_calls), runs the
// tool and sends its result as a `tool` message; the model answers with that text ("5", no
// tool call) and the loop ends. Every test checks the framework saw the call (name and
// parsed arguments), ran the tool once and ended with "5", and, from the request bodies its
// fetch sent, that both requests had temperature 0 and the tools, and that the second sent
// the server's call back (assistant tool_calls with the server's id, then a `tool` message
// answering that id).
//
// Prints `ok <name>` or `FAIL <name>: why` per test; exits 1 if any failed, 77 (ctest skip)
// when the framework packages are not installed (run scripts/setup.sh). The server is
// killed at exit whatever happens.
//
// Frameworks (versions pinned in tests/js/package.json, all running on Node 20): openai,
// @openai/agents, @langchain/openai + @langchain/core, ai + @ai-sdk/openai-compatible.

import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { SwarmServer, assert, bodyRecorder, withTimeout } from './swarm_server.mjs';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const TEST_TIMEOUT_MS = 30_000;
const PACKAGES = ['openai', '@openai/agents', '@langchain/openai', '@langchain/core', 'ai',
  '@ai-sdk/openai-compatible', 'zod'];

const binary = process.argv[2] && path.resolve(process.argv[2]);
if (!binary) {
  console.error('usage: node tool_loops.mjs <path-to-swarm-server>');
  process.exit(2);
}
const missing = PACKAGES.filter(p => !fs.existsSync(path.join(HERE, 'node_modules', p, 'package.json')));
if (missing.length) {
  console.log(`skip: ${missing.join(', ')} not installed in ${HERE}/node_modules (run scripts/setup.sh)`);
  process.exit(77);
}

const { default: OpenAI } = await import('openai');
const agents = await import('@openai/agents');
const { ChatOpenAI } = await import('@langchain/openai');
const { HumanMessage, ToolMessage } = await import('@langchain/core/messages');
const { tool: lcTool } = await import('@langchain/core/tools');
const ai = await import('ai');
const { createOpenAICompatible } = await import('@ai-sdk/openai-compatible');
const { z } = await import('zod');

// ------------------------------------------------------------------------------ server
const server = new SwarmServer(binary, 'swarm-tool-loops-');

// ------------------------------------------------------------------------------ script
const CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>';
const ADD_PARAMS = {
  type: 'object',
  properties: { a: { type: 'number' }, b: { type: 'number' } },
  required: ['a', 'b'],
  additionalProperties: false,
};
const ADD_TOOL = { type: 'function', function: { name: 'add', description: 'Add two numbers', parameters: ADD_PARAMS } };

function checkArgs(args, where) {
  assert(args && args.a === 2 && args.b === 3, `${where}: arguments ${JSON.stringify(args)}, expected {a: 2, b: 3}`);
}
function checkFinal(text, where) {
  assert(text === '5', `${where}: final answer ${JSON.stringify(text)}, expected "5"`);
}
// A tool that records its calls, so each test can check the framework ran it once with {2, 3}.
function makeAdd() {
  const calls = [];
  const add = ({ a, b }) => { calls.push({ a, b }); return String(a + b); };
  return { add, calls };
}
function checkRanOnce(calls, where) {
  assert(calls.length === 1, `${where}: add ran ${calls.length} times (${JSON.stringify(calls)}), expected once`);
  checkArgs(calls[0], where);
}

// A fetch that keeps every chat request body, handed to each framework (directly or through
// its OpenAI client), so a test can check what went over the wire: temperature 0 in every
// request, and a last request that sends the server's call back (an assistant message with
// tool_calls, then a `tool` message answering that call's id with "5").
const recorder = bodyRecorder;
function checkWire({ bodies }, where, stream) {
  assert(bodies.length === 2, `${where}: ${bodies.length} chat requests, expected 2`);
  for (const b of bodies) assert(!!b.stream === stream, `${where}: a request has stream ${b.stream}, expected ${stream}`);
  for (const b of bodies) assert(b.temperature === 0, `${where}: a request has temperature ${b.temperature}`);
  assert(bodies.every(b => b.tools?.length === 1 && b.tools[0].function?.name === 'add'), `${where}: tools not sent`);
  const msgs = bodies[1].messages;
  const toolMsg = msgs[msgs.length - 1];
  const asst = msgs[msgs.length - 2];
  assert(toolMsg?.role === 'tool' && toolMsg.content === '5', `${where}: last message ${JSON.stringify(toolMsg)}`);
  const call = asst?.tool_calls?.[0];
  assert(asst?.role === 'assistant' && asst.tool_calls.length === 1 && call.function?.name === 'add' &&
    /^call_/.test(call.id) && toolMsg.tool_call_id === call.id,
  `${where}: assistant turn sent back as ${JSON.stringify(asst)}, tool message ${JSON.stringify(toolMsg)}`);
  checkArgs(JSON.parse(call.function.arguments), `${where}: arguments sent back`);
}

// ------------------------------------------------------------------------------ tests
const tests = [];
const test = (name, fn) => tests.push({ name, fn });

test('openai chat.completions manual loop', async ({ baseURL, apiKey }) => {
  const rec = recorder();
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, fetch: rec.fetch });
  const messages = [{ role: 'user', content: CALL }];
  const first = await client.chat.completions.create({ model: 'mock', temperature: 0, messages, tools: [ADD_TOOL] });
  const choice = first.choices[0];
  assert(choice.finish_reason === 'tool_calls', `turn 1 finish_reason ${choice.finish_reason}`);
  const calls = choice.message.tool_calls ?? [];
  assert(calls.length === 1, `turn 1: ${calls.length} tool calls: ${JSON.stringify(choice.message)}`);
  const call = calls[0];
  assert(call.type === 'function' && call.function.name === 'add' && typeof call.id === 'string' && call.id,
    `turn 1 tool call ${JSON.stringify(call)}`);
  const args = JSON.parse(call.function.arguments);
  checkArgs(args, 'turn 1');
  messages.push(choice.message); // content null, as the SDK returns it
  messages.push({ role: 'tool', tool_call_id: call.id, content: String(args.a + args.b) });
  const second = await client.chat.completions.create({ model: 'mock', temperature: 0, messages, tools: [ADD_TOOL] });
  assert(second.choices[0].finish_reason === 'stop', `turn 2 finish_reason ${second.choices[0].finish_reason}`);
  assert(!second.choices[0].message.tool_calls?.length, 'turn 2 has tool calls');
  checkFinal(second.choices[0].message.content, 'turn 2');
  checkWire(rec, 'wire', false);
});

test('openai chat.completions streamed manual loop', async ({ baseURL, apiKey }) => {
  const rec = recorder();
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, fetch: rec.fetch });
  const messages = [{ role: 'user', content: CALL }];
  const stream = await client.chat.completions.create(
    { model: 'mock', temperature: 0, messages, tools: [ADD_TOOL], stream: true });
  const acc = []; // accumulated by index, as OpenAI's docs show
  let content = '';
  let finish = null;
  for await (const chunk of stream) {
    const c = chunk.choices[0];
    if (!c) continue;
    if (c.delta?.content) content += c.delta.content;
    for (const d of c.delta?.tool_calls ?? []) {
      if (!acc[d.index]) {
        assert(d.id && d.type === 'function' && d.function?.name, `first delta of call ${d.index}: ${JSON.stringify(d)}`);
        acc[d.index] = { id: d.id, type: 'function', function: { name: d.function.name, arguments: '' } };
      }
      acc[d.index].function.arguments += d.function?.arguments ?? '';
    }
    if (c.finish_reason) finish = c.finish_reason;
  }
  assert(finish === 'tool_calls', `turn 1 finish_reason ${finish}`);
  assert(acc.length === 1 && acc[0].function.name === 'add', `turn 1 tool calls ${JSON.stringify(acc)}`);
  const args = JSON.parse(acc[0].function.arguments);
  checkArgs(args, 'turn 1');
  messages.push({ role: 'assistant', content: content || null, tool_calls: acc });
  messages.push({ role: 'tool', tool_call_id: acc[0].id, content: String(args.a + args.b) });
  const stream2 = await client.chat.completions.create(
    { model: 'mock', temperature: 0, messages, tools: [ADD_TOOL], stream: true });
  let text = '';
  for await (const chunk of stream2) {
    assert(!chunk.choices[0]?.delta?.tool_calls, 'turn 2 streamed a tool call');
    text += chunk.choices[0]?.delta?.content ?? '';
  }
  checkFinal(text, 'turn 2');
  checkWire(rec, 'wire', true);
});

for (const stream of [false, true]) {
  test(`openai chat.completions.runTools${stream ? ' (stream)' : ''}`, async ({ baseURL, apiKey }) => {
    const rec = recorder();
    const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, fetch: rec.fetch });
    const { add, calls } = makeAdd();
    const runner = client.chat.completions.runTools({
      model: 'mock', temperature: 0, stream,
      messages: [{ role: 'user', content: CALL }],
      tools: [{ type: 'function', function: { function: add, parse: JSON.parse, name: 'add', description: 'Add two numbers', parameters: ADD_PARAMS } }],
    });
    const final = await runner.finalContent();
    checkRanOnce(calls, 'runTools');
    const toolMsgs = runner.messages.filter(m => m.role === 'tool');
    assert(toolMsgs.length === 1 && toolMsgs[0].content === '5', `tool messages ${JSON.stringify(toolMsgs)}`);
    checkFinal(final, 'runTools');
    checkWire(rec, 'wire', stream);
  });
}

for (const stream of [false, true]) {
  test(`@openai/agents run (chat_completions${stream ? ', stream' : ''})`, async ({ baseURL, apiKey }) => {
    const rec = recorder();
    agents.setTracingDisabled(true);
    agents.setOpenAIAPI('chat_completions');
    const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, fetch: rec.fetch });
    const { add, calls } = makeAdd();
    const addTool = agents.tool({
      name: 'add', description: 'Add two numbers',
      parameters: z.object({ a: z.number(), b: z.number() }),
      execute: add,
    });
    const agent = new agents.Agent({
      name: 'adder', instructions: 'Use the add tool.', model: 'mock',
      modelSettings: { temperature: 0 }, tools: [addTool],
    });
    let result;
    if (!stream) { // the global client and run()
      agents.setDefaultOpenAIClient(client);
      result = await agents.run(agent, CALL, { maxTurns: 4 });
    } else { // a provider of its own, and a streamed run
      const runner = new agents.Runner({ modelProvider: new agents.OpenAIProvider({ openAIClient: client }) });
      result = await runner.run(agent, CALL, { stream: true, maxTurns: 4 });
      for await (const _ of result) { /* drain the events */ }
      await result.completed;
    }
    checkRanOnce(calls, 'agents');
    checkFinal(result.finalOutput, 'agents');
    checkWire(rec, 'wire', stream);
  });
}

for (const stream of [false, true]) {
  test(`@langchain/openai ChatOpenAI.bindTools${stream ? ' (stream)' : ''}`, async ({ baseURL, apiKey }) => {
    const rec = recorder();
    const { add, calls } = makeAdd();
    const addTool = lcTool(add, {
      name: 'add', description: 'Add two numbers', schema: z.object({ a: z.number(), b: z.number() }),
    });
    const llm = new ChatOpenAI({ model: 'mock', temperature: 0, apiKey, maxRetries: 0, configuration: { baseURL, fetch: rec.fetch } })
      .bindTools([addTool]);
    const call = async messages => {
      if (!stream) return llm.invoke(messages);
      let acc;
      for await (const chunk of await llm.stream(messages)) acc = acc ? acc.concat(chunk) : chunk;
      return acc;
    };
    const messages = [new HumanMessage(CALL)];
    const ai1 = await call(messages);
    assert(ai1.tool_calls?.length === 1 && ai1.tool_calls[0].name === 'add',
      `turn 1 tool_calls ${JSON.stringify(ai1.tool_calls)} (invalid: ${JSON.stringify(ai1.invalid_tool_calls)})`);
    checkArgs(ai1.tool_calls[0].args, 'turn 1');
    messages.push(ai1);
    messages.push(await addTool.invoke(ai1.tool_calls[0])); // a ToolMessage with the call's id
    assert(messages[2] instanceof ToolMessage && messages[2].content === '5', `tool message ${JSON.stringify(messages[2])}`);
    const ai2 = await call(messages);
    assert(!ai2.tool_calls?.length, `turn 2 tool_calls ${JSON.stringify(ai2.tool_calls)}`);
    checkRanOnce(calls, 'langchain');
    checkFinal(ai2.content, 'turn 2');
    checkWire(rec, 'wire', stream);
  });
}

for (const stream of [false, true]) {
  test(`ai ${stream ? 'streamText' : 'generateText'} (@ai-sdk/openai-compatible)`, async ({ baseURL, apiKey }) => {
    const rec = recorder();
    const provider = createOpenAICompatible({ name: 'swarm', baseURL, apiKey, fetch: rec.fetch });
    const { add, calls } = makeAdd();
    const args = {
      model: provider('mock'), temperature: 0, maxRetries: 0,
      prompt: CALL,
      tools: {
        add: ai.tool({ description: 'Add two numbers', inputSchema: z.object({ a: z.number(), b: z.number() }), execute: add }),
      },
      stopWhen: ai.stepCountIs(4),
    };
    let text, steps;
    if (stream) {
      let streamError = null;
      const result = ai.streamText({ ...args, onError: ({ error }) => { streamError = error; } });
      text = '';
      for await (const piece of result.textStream) text += piece;
      if (streamError) throw streamError;
      steps = await result.steps;
      assert(text === await result.text, 'streamed text differs from result.text');
      text = await result.text;
    } else {
      const result = await ai.generateText(args);
      text = result.text;
      steps = result.steps;
    }
    assert(steps.length === 2, `${steps.length} steps, expected 2`);
    assert(steps[0].finishReason === 'tool-calls', `step 1 finishReason ${steps[0].finishReason}`);
    assert(steps[0].toolCalls.length === 1 && steps[0].toolCalls[0].toolName === 'add',
      `step 1 toolCalls ${JSON.stringify(steps[0].toolCalls)}`);
    checkArgs(steps[0].toolCalls[0].input, 'step 1');
    checkRanOnce(calls, 'ai');
    checkFinal(text, 'ai');
    checkWire(rec, 'wire', stream);
  });
}

// ------------------------------------------------------------------------------ main
let failed = 0;
try {
  await server.start();
  await server.startEngine('model: mock\nbatch_size: 100\nnum_repeat: 1\nmax_parallel_episodes: 32\n');
  const only = process.env.TOOL_LOOPS_ONLY; // a substring of test names, to run a few
  for (const { name, fn } of tests) {
    if (only && !name.includes(only)) continue;
    let claim = null;
    try {
      claim = await server.post('/claim_episode', { client_uuid: 'js', discard_episode_timeout: 120 });
      assert(claim.success, `claim_episode: ${JSON.stringify(claim)}`);
      await withTimeout(fn({ baseURL: claim.openai_base_url, apiKey: claim.openai_api_key }), TEST_TIMEOUT_MS);
      console.log(`ok ${name}`);
    } catch (e) {
      failed++;
      const cause = e?.cause ? ` (cause: ${e.cause?.message ?? e.cause})` : '';
      console.log(`FAIL ${name}: ${e?.stack ?? e}${cause}`);
    } finally {
      if (claim?.episode_uuid) {
        await server.post('/abort_episode', { client_uuid: 'js', episode_uuid: claim.episode_uuid, declare_client_active: false })
          .catch(e => { console.log(`note: abort_episode ${claim.episode_uuid}: ${e.message}`); });
      }
    }
  }
} catch (e) {
  failed++;
  console.log(`FAIL setup: ${e?.stack ?? e}`);
}
if (failed) {
  console.log(`${failed} failed; server log tail:\n${server.logTail()}`);
}
process.exit(failed ? 1 : 0);
