// Structured outputs through real clients, on the torch engine with a random model.
//
// Usage: node tests/js/structured_outputs.mjs <swarm-server> <swarm-model>
//
// A randomly initialised tiny Qwen3 (tests/data/tiny-qwen3 + Qwen3's tokenizer and template,
// `swarm-model init`) sampling at temperature 1 can only write what the grammar allows, so:
//  * the official `openai` SDK's `chat.completions.parse` with a zod schema (zodResponseFormat)
//    returns `message.parsed` that the zod schema accepts;
//  * an `@openai/agents` Agent with a zod `outputType` (chat_completions API, tracing off) runs
//    to a `finalOutput` the schema accepts;
//  * LangChain's `withStructuredOutput` (both the jsonSchema and the functionCalling method) and
//    the AI SDK's `generateObject` return objects the schema accepts;
//  * the schema (bounded numbers, a pattern) reaches the server with its bounds and pattern;
//  * an `@openai/agents` Agent with `modelSettings.toolChoice: 'required'` calls its tool (the
//    SDK resets tool_choice after the call, so the next turn ends the run).
// Every request body is kept, to check what each client sent (response_format json_schema,
// tool_choice required). Prints `ok <name>` / `FAIL <name>: why`; exit 1 on failure, 77 (ctest
// skip) when the npm packages are missing.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { SwarmServer, assert, bodyRecorder, withTimeout } from './swarm_server.mjs';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.resolve(HERE, '..', '..');
const [serverBin, modelBin] = process.argv.slice(2).map(p => p && path.resolve(p));
if (!serverBin || !modelBin) {
  console.error('usage: node structured_outputs.mjs <swarm-server> <swarm-model>');
  process.exit(2);
}
const missing = ['openai', '@openai/agents', 'zod', '@langchain/openai', '@langchain/core', 'ai',
  '@ai-sdk/openai-compatible'].filter(p => !fs.existsSync(path.join(HERE, 'node_modules', p, 'package.json')));
if (missing.length) {
  console.log(`skip: ${missing.join(', ')} not installed in ${HERE}/node_modules (run scripts/setup.sh)`);
  process.exit(77);
}
const { default: OpenAI } = await import('openai');
const { zodResponseFormat } = await import('openai/helpers/zod');
const agents = await import('@openai/agents');
const { z } = await import('zod');
const { ChatOpenAI } = await import('@langchain/openai');
const ai = await import('ai');
const { createOpenAICompatible } = await import('@ai-sdk/openai-compatible');

const server = new SwarmServer(serverBin, 'swarm-structured-', ['--engine', 'torch']);

function makeModel() {
  const src = path.join(server.workdir, 'src');
  const out = path.join(server.workdir, 'model');
  fs.mkdirSync(src);
  for (const f of ['config.json', 'generation_config.json']) fs.copyFileSync(path.join(ROOT, 'tests/data/tiny-qwen3', f), path.join(src, f));
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) fs.copyFileSync(path.join(ROOT, 'tests/fixtures/tokenizers/qwen3', f), path.join(src, f));
  execFileSync(modelBin, ['init', '--from', src, '--out', out, '--dtype', 'f32', '--seed', '5'], { stdio: 'ignore' });
  return out;
}

const recorder = bodyRecorder;

// Short strings, enums, bounded integers and numbers, a pattern: a random model finishes
// within max_tokens, and every value the grammar lets it write passes zod.
const Weather = z.object({
  city: z.string().max(8),
  station: z.string().regex(/^[A-Z]{3}-[0-9]{2}$/),
  unit: z.enum(['C', 'F']),
  temperature: z.number().int().min(-40).max(50),
  humidity: z.number().min(0).max(100),
  wind: z.number().positive().lt(150),
  windy: z.boolean(),
  tags: z.array(z.enum(['sun', 'rain', 'snow'])).max(3),
});
// The schema each client sent must carry the bounds and the pattern (not have them stripped).
function assertBoundsSent(schema, what) {
  const p = schema?.properties ?? {};
  assert(p.humidity?.minimum === 0 && p.humidity?.maximum === 100, `${what}: humidity bounds sent: ${JSON.stringify(p.humidity)}`);
  assert(p.wind?.exclusiveMinimum === 0, `${what}: wind bounds sent: ${JSON.stringify(p.wind)}`);
  assert(typeof p.station?.pattern === 'string', `${what}: station pattern sent: ${JSON.stringify(p.station)}`);
}

const tests = [];
const test = (name, fn) => tests.push({ name, fn });

test('openai chat.completions.parse with zodResponseFormat', async ({ baseURL, apiKey }) => {
  const rec = recorder();
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, fetch: rec.fetch });
  for (let seed = 0; seed < 3; seed++) {
    const r = await client.chat.completions.parse({
      model: 'm', temperature: 1, seed, messages: [{ role: 'user', content: 'Weather in Paris?' }],
      response_format: zodResponseFormat(Weather, 'weather'),
    });
    const msg = r.choices[0].message;
    assert(r.choices[0].finish_reason === 'stop', `finish_reason ${r.choices[0].finish_reason}: ${msg.content}`);
    assert(msg.parsed && Weather.safeParse(msg.parsed).success, `parsed ${JSON.stringify(msg.parsed)} from ${msg.content}`);
  }
  const rf = rec.bodies[0].response_format;
  assert(rf?.type === 'json_schema' && rf.json_schema?.name === 'weather' && rf.json_schema.schema?.type === 'object',
    `response_format sent: ${JSON.stringify(rf)}`);
  assertBoundsSent(rf.json_schema.schema, 'openai');
});

test('@openai/agents outputType (zod)', async ({ baseURL, apiKey }) => {
  const rec = recorder();
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, fetch: rec.fetch });
  const model = new agents.OpenAIChatCompletionsModel(client, 'm');
  const agent = new agents.Agent({ name: 'forecaster', instructions: 'Report the weather.', model, outputType: Weather });
  const result = await agents.run(agent, 'Weather in Oslo?');
  assert(Weather.safeParse(result.finalOutput).success, `finalOutput ${JSON.stringify(result.finalOutput)}`);
  assert(rec.bodies[0].response_format?.type === 'json_schema', `response_format sent: ${JSON.stringify(rec.bodies[0].response_format)}`);
});

for (const method of ['jsonSchema', 'functionCalling']) {
  test(`@langchain/openai withStructuredOutput (${method})`, async ({ baseURL, apiKey }) => {
    const rec = recorder();
    const llm = new ChatOpenAI({ model: 'm', temperature: 1, apiKey, maxRetries: 0, configuration: { baseURL, fetch: rec.fetch } });
    const structured = llm.withStructuredOutput(Weather, { name: 'weather', method });
    for (let i = 0; i < 2; i++) {
      const out = await structured.invoke('Weather in Rome?');
      assert(Weather.safeParse(out).success, `output ${JSON.stringify(out)}`);
    }
    const body = rec.bodies[0];
    const schema = method === 'jsonSchema' ? body.response_format?.json_schema?.schema : body.tools?.[0]?.function?.parameters;
    assert(schema, `request sent: ${JSON.stringify(body)}`);
    assertBoundsSent(schema, `langchain ${method}`);
    if (method === 'functionCalling')
      assert(body.tool_choice?.function?.name === 'weather', `tool_choice sent: ${JSON.stringify(body.tool_choice)}`);
  });
}

test('ai generateObject (@ai-sdk/openai-compatible, structured outputs)', async ({ baseURL, apiKey }) => {
  const rec = recorder();
  const provider = createOpenAICompatible({ name: 'swarm', baseURL, apiKey, fetch: rec.fetch, supportsStructuredOutputs: true });
  for (let seed = 0; seed < 2; seed++) {
    const { object } = await ai.generateObject({ model: provider.chatModel('m'), schema: Weather, schemaName: 'weather',
      prompt: 'Weather in Lima?', temperature: 1, seed, maxRetries: 0 });
    assert(Weather.safeParse(object).success, `object ${JSON.stringify(object)}`);
  }
  const rf = rec.bodies[0].response_format;
  assert(rf?.type === 'json_schema', `response_format sent: ${JSON.stringify(rf)}`);
  assertBoundsSent(rf.json_schema?.schema, 'ai');
});

test("@openai/agents toolChoice 'required'", async ({ baseURL, apiKey }) => {
  const rec = recorder();
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, fetch: rec.fetch });
  const model = new agents.OpenAIChatCompletionsModel(client, 'm');
  const calls = [];
  const lookup = agents.tool({
    name: 'lookup', description: 'Look a city up.',
    parameters: z.object({ city: z.enum(['Paris', 'Oslo', 'Rome']) }),
    execute: async ({ city }) => { calls.push(city); return `${city}: 21 C`; },
  });
  const agent = new agents.Agent({ name: 'caller', instructions: 'Use the tool.', model, tools: [lookup],
    modelSettings: { toolChoice: 'required', temperature: 1 } });
  await agents.run(agent, 'Weather somewhere?', { maxTurns: 4 });
  assert(calls.length >= 1 && ['Paris', 'Oslo', 'Rome'].includes(calls[0]), `tool calls ${JSON.stringify(calls)}`);
  assert(rec.bodies[0].tool_choice === 'required', `tool_choice sent: ${JSON.stringify(rec.bodies[0].tool_choice)}`);
});

let failed = 0;
try {
  agents.setTracingDisabled(true);
  agents.setOpenAIAPI('chat_completions');
  const model = makeModel();
  await server.start();
  await server.startEngine([`model: ${model}`, 'batch_size: 100', 'num_repeat: 1', 'max_response_length: 200',
    'max_prompt_length: 1500', 'max_parallel_episodes: 8', ''].join('\n'), 120_000);
  for (const { name, fn } of tests) {
    let claim = null;
    try {
      claim = await server.post('/claim_episode', { client_uuid: 'js', discard_episode_timeout: 300 });
      assert(claim.success, `claim_episode: ${JSON.stringify(claim)}`);
      await withTimeout(fn({ baseURL: claim.openai_base_url, apiKey: claim.openai_api_key }), 240_000);
      console.log(`ok ${name}`);
    } catch (e) {
      failed++;
      console.log(`FAIL ${name}: ${e?.stack ?? e}`);
    } finally {
      if (claim?.episode_uuid)
        await server.post('/abort_episode', { client_uuid: 'js', episode_uuid: claim.episode_uuid }).catch(() => {});
    }
  }
} catch (e) {
  failed++;
  console.log(`FAIL setup: ${e?.stack ?? e}`);
}
if (failed) console.log(`${failed} failed; server log tail:\n${server.logTail()}`);
process.exit(failed ? 1 : 0);
