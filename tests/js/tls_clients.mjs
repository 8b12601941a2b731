// The official OpenAI SDK (and Node's fetch) against swarm-server over TLS:
// a self-signed certificate made with `openssl`, the server started with --tls-cert/--tls-key,
// the control and episode routes and a chat completion (plain and streamed) over https, with
// Node verifying the certificate through NODE_EXTRA_CA_CERTS. Without the CA, Node refuses.
//
// Node reads NODE_EXTRA_CA_CERTS at start, so the script runs itself twice: the parent makes the
// certificate, checks that an unverified fetch fails, and re-runs itself with the CA set.
// Usage: node tls_clients.mjs <path-to-swarm-server>       (exit 77 = skipped)
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { SwarmServer, assert, withTimeout } from './swarm_server.mjs';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const binary = process.argv[2] && path.resolve(process.argv[2]);
if (!binary) {
  console.error('usage: node tls_clients.mjs <path-to-swarm-server>');
  process.exit(2);
}
if (!fs.existsSync(path.join(HERE, 'node_modules', 'openai', 'package.json'))) {
  console.log(`skip: openai not installed in ${HERE}/node_modules (run scripts/setup.sh)`);
  process.exit(77);
}

if (!process.env.SWARM_TLS_TEST_CERT) {
  // Parent: the certificate, then the test proper in a child that trusts it.
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'swarm-js-tls-'));
  const cert = path.join(dir, 'server.crt');
  const key = path.join(dir, 'server.key');
  const made = spawnSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes',
    '-days', '1', '-subj', '/CN=localhost', '-addext', 'subjectAltName=DNS:localhost,IP:127.0.0.1',
    '-keyout', key, '-out', cert], { encoding: 'utf8' });
  if (made.error || made.status !== 0) {
    console.log(`skip: cannot make a certificate with openssl: ${made.error?.message ?? made.stderr}`);
    fs.rmSync(dir, { recursive: true, force: true });
    process.exit(77);
  }
  let failed = false;
  // Without the CA, Node's fetch refuses the server.
  const server = new SwarmServer(binary, 'swarm-js-tls-untrusted-', ['--tls-cert', cert, '--tls-key', key]);
  try {
    const base = await server.start();
    assert(base.startsWith('https://'), `server base ${base}`);
    let refused = null;
    try {
      await fetch(base + '/get_engine_status');
    } catch (e) {
      refused = e;
    }
    assert(refused, 'fetch accepted a self-signed certificate it was not told to trust');
    const why = String(refused.cause?.code ?? refused.cause?.message ?? refused.message);
    assert(/SELF_SIGNED|self.signed|certificate/i.test(why), `unexpected refusal: ${why}`);
    console.log(`ok untrusted certificate refused (${why})`);
  } catch (e) {
    failed = true;
    console.log(`FAIL untrusted: ${e?.stack ?? e}\n${server.logTail()}`);
  } finally {
    server.cleanup();
  }
  const child = spawnSync(process.execPath, [fileURLToPath(import.meta.url), binary], {
    stdio: 'inherit',
    env: { ...process.env, SWARM_TLS_TEST_CERT: cert, SWARM_TLS_TEST_KEY: key, NODE_EXTRA_CA_CERTS: cert },
  });
  fs.rmSync(dir, { recursive: true, force: true });
  process.exit(failed || child.status !== 0 ? 1 : 0);
}

// Child: Node trusts the certificate (NODE_EXTRA_CA_CERTS).
const { default: OpenAI } = await import('openai');
const server = new SwarmServer(binary, 'swarm-js-tls-',
  ['--tls-cert', process.env.SWARM_TLS_TEST_CERT, '--tls-key', process.env.SWARM_TLS_TEST_KEY]);
let failed = 0;
try {
  const base = await server.start();
  assert(base.startsWith('https://'), `server base ${base}`);
  await server.startEngine('model: mock\nbatch_size: 1\nnum_repeat: 2\n');
  console.log('ok control routes over https');
  for (let k = 0; k < 2; k++) {
    const claim = await server.post('/claim_episode', { client_uuid: 'js-tls', discard_episode_timeout: 120 });
    assert(claim.success, `claim_episode: ${JSON.stringify(claim)}`);
    assert(claim.openai_base_url.startsWith('https://'), `openai_base_url ${claim.openai_base_url}`);
    const client = new OpenAI({ baseURL: claim.openai_base_url, apiKey: claim.openai_api_key, maxRetries: 0 });
    const r = await withTimeout(client.chat.completions.create({
      model: 'mock', messages: [{ role: 'user', content: `hello ${k}` }], max_tokens: 8,
    }), 30_000);
    assert(r.choices?.[0]?.message?.content?.length > 0, `chat: ${JSON.stringify(r)}`);
    let streamed = '';
    const stream = await withTimeout(client.chat.completions.create({
      model: 'mock', messages: [{ role: 'user', content: `stream ${k}` }], max_tokens: 8, stream: true,
    }), 30_000);
    for await (const chunk of stream) streamed += chunk.choices?.[0]?.delta?.content ?? '';
    assert(streamed.length > 0, 'the streamed answer was empty');
    const end = await server.post('/end_episode', {
      client_uuid: 'js-tls', episode_uuid: claim.episode_uuid, task_id: 't', workflow_output: { reward: k },
    });
    assert(end.success !== false, `end_episode: ${JSON.stringify(end)}`);
  }
  console.log('ok openai SDK chat + stream over https, episodes ended');
  for (let i = 0; i < 200; i++) {
    const st = await server.status();
    if (st.global_step >= 1) break;
    if (i === 199) throw new Error(`no training step: ${JSON.stringify(st)}`);
    await new Promise(r => setTimeout(r, 50));
  }
  console.log('ok the step trained on the https episodes');
} catch (e) {
  failed++;
  console.log(`FAIL: ${e?.stack ?? e}${e?.cause ? ` (cause: ${e.cause?.message ?? e.cause})` : ''}\n${server.logTail()}`);
}
process.exit(failed ? 1 : 0);
