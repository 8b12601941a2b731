// The official SDKs of the harness APIs against a claimed episode: the Anthropic
// SDK (`messages.create`, `messages.stream`, `messages.countTokens`, a tool loop) and the openai
// SDK's Responses API (`responses.create`, `responses.stream`, text and function calls).
//
// Usage: node tests/js/harness_sdks.mjs <path-to-swarm-server>
//
// Mock engine at temperature 0: it answers with the last user / tool message, so a user message
// holding `<tool_call>{"name": "add", ...}</tool_call>` makes the "model" call add. Prints
// `ok <name>` or `FAIL <name>: why`; exits 1 if any failed, 77 when the packages are missing.

import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { SwarmServer, assert, withTimeout } from './swarm_server.mjs';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const binary = process.argv[2] && path.resolve(process.argv[2]);
if (!binary) {
  console.error('usage: node harness_sdks.mjs <path-to-swarm-server>');
  process.exit(2);
}
const missing = ['@anthropic-ai/sdk', 'openai'].filter(p => !fs.existsSync(path.join(HERE, 'node_modules', p, 'package.json')));
if (missing.length) {
  console.log(`skip: ${missing.join(', ')} not installed (run scripts/setup.sh)`);
  process.exit(77);
}
const { default: Anthropic } = await import('@anthropic-ai/sdk');
const { default: OpenAI } = await import('openai');

const CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>';
const addTool = { name: 'add', description: 'Add two numbers', input_schema: { type: 'object', properties: { a: { type: 'number' }, b: { type: 'number' } }, required: ['a', 'b'] } };
const addFunction = { type: 'function', name: 'add', description: 'Add two numbers', parameters: addTool.input_schema, strict: false };

const tests = {
  async 'anthropic messages.create and countTokens'({ anthropic }) {
    const params = { model: 'm', max_tokens: 64, system: 'Be brief.', messages: [{ role: 'user', content: 'hello anthropic' }] };
    const m = await anthropic.messages.create(params);
    assert(m.type === 'message' && m.role === 'assistant', JSON.stringify(m));
    assert(m.content.length === 1 && m.content[0].type === 'text' && m.content[0].text === 'hello anthropic', JSON.stringify(m.content));
    assert(m.stop_reason === 'end_turn', m.stop_reason);
    const { input_tokens } = await anthropic.messages.countTokens({ model: 'm', system: params.system, messages: params.messages });
    assert(input_tokens === m.usage.input_tokens, `countTokens ${input_tokens} vs usage.input_tokens ${m.usage.input_tokens}`);
  },
  async 'anthropic messages.stream'({ anthropic }) {
    const stream = anthropic.messages.stream({ model: 'm', max_tokens: 64, messages: [{ role: 'user', content: 'streamed words here' }] });
    let text = '';
    stream.on('text', t => { text += t; });
    const final = await stream.finalMessage();
    assert(text === 'streamed words here', `streamed ${JSON.stringify(text)}`);
    assert(final.content[0].text === text && final.stop_reason === 'end_turn', JSON.stringify(final));
    assert(final.usage.output_tokens > 0, JSON.stringify(final.usage));
  },
  async 'anthropic tool loop (streamed tool_use, tool_result back)'({ anthropic }) {
    const messages = [{ role: 'user', content: CALL }];
    const first = await anthropic.messages.stream({ model: 'm', max_tokens: 128, tools: [addTool], messages }).finalMessage();
    assert(first.stop_reason === 'tool_use', `stop_reason ${first.stop_reason}`);
    const use = first.content.find(b => b.type === 'tool_use');
    assert(use && use.name === 'add' && use.input.a === 2 && use.input.b === 3, JSON.stringify(first.content));
    messages.push({ role: 'assistant', content: first.content });
    messages.push({ role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: String(use.input.a + use.input.b) }] });
    const second = await anthropic.messages.create({ model: 'm', max_tokens: 64, tools: [addTool], messages });
    assert(second.content[0].text === '5' && second.stop_reason === 'end_turn', JSON.stringify(second));
  },
  async 'anthropic errors'({ anthropic, claim }) {
    const stranger = new Anthropic({ baseURL: claim.anthropic_base_url, apiKey: 'sk-nobody', maxRetries: 0 });
    try {
      await stranger.messages.create({ model: 'm', max_tokens: 8, messages: [{ role: 'user', content: 'x' }] });
      throw new Error('a stranger was served');
    } catch (e) {
      assert(e instanceof Anthropic.AuthenticationError, `got ${e}`);
    }
    try {
      await anthropic.messages.create({ model: 'm', max_tokens: 8, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AAAA' } }] }] });
      throw new Error('an image was accepted');
    } catch (e) {
      assert(e instanceof Anthropic.BadRequestError && e.error?.error?.type === 'invalid_request_error', `got ${e}`);
    }
  },
  async 'openai responses.create text'({ openai }) {
    const r = await openai.responses.create({ model: 'm', instructions: 'Be brief.', input: 'hello responses' });
    assert(r.object === 'response' && r.status === 'completed', JSON.stringify(r));
    assert(r.output_text === 'hello responses', `output_text ${JSON.stringify(r.output_text)}`);
  },
  async 'openai responses.stream text'({ openai }) {
    const stream = openai.responses.stream({ model: 'm', input: [{ role: 'user', content: [{ type: 'input_text', text: 'streamed response' }] }] });
    let text = '';
    stream.on('response.output_text.delta', e => { text += e.delta; });
    const final = await stream.finalResponse();
    assert(text === 'streamed response' && final.output_text === text, `streamed ${JSON.stringify(text)}, final ${JSON.stringify(final.output_text)}`);
  },
  async 'openai responses function call loop (streamed)'({ openai }) {
    const input = [{ role: 'user', content: CALL }];
    const first = await openai.responses.stream({ model: 'm', input, tools: [addFunction] }).finalResponse();
    const call = first.output.find(i => i.type === 'function_call');
    assert(call && call.name === 'add', JSON.stringify(first.output));
    const args = JSON.parse(call.arguments);
    assert(args.a === 2 && args.b === 3, call.arguments);
    input.push(call, { type: 'function_call_output', call_id: call.call_id, output: String(args.a + args.b) });
    const second = await openai.responses.create({ model: 'm', input, tools: [addFunction] });
    assert(second.output_text === '5', JSON.stringify(second.output));
  },
  async 'openai responses errors'({ openai }) {
    try {
      await openai.responses.create({ model: 'm', input: 'x', previous_response_id: 'resp_123' });
      throw new Error('previous_response_id was accepted');
    } catch (e) {
      assert(e instanceof OpenAI.BadRequestError && /previous_response_id/.test(e.message), `got ${e}`);
    }
  },
};

const server = new SwarmServer(binary, 'swarm-harness-sdks-');
let failed = 0;
try {
  await server.start();
  await server.startEngine('model: mock\nbatch_size: 100\nnum_repeat: 1\nmax_parallel_episodes: 32\ntemperature: 0\n');
  for (const [name, fn] of Object.entries(tests)) {
    const claim = await server.post('/claim_episode', { client_uuid: 'js', discard_episode_timeout: 120 });
    try {
      assert(claim.success, `claim_episode: ${JSON.stringify(claim)}`);
      const anthropic = new Anthropic({ baseURL: claim.anthropic_base_url, apiKey: claim.openai_api_key, maxRetries: 0 });
      const openai = new OpenAI({ baseURL: claim.openai_base_url, apiKey: claim.openai_api_key, maxRetries: 0 });
      await withTimeout(fn({ anthropic, openai, claim }), 30_000);
      console.log(`ok ${name}`);
    } catch (e) {
      failed++;
      console.log(`FAIL ${name}: ${e?.stack ?? e}`);
    } finally {
      await server.post('/abort_episode', { client_uuid: 'js', episode_uuid: claim.episode_uuid }).catch(() => {});
    }
  }
} catch (e) {
  failed++;
  console.log(`FAIL setup: ${e?.stack ?? e}\n${server.logTail()}`);
}
process.exit(failed ? 1 : 0);
