// Reference tokenizer for swarm's tokenizer parity test (tests/unit/text/test_tokenizer.cpp).
//
// Reads one JSON object on stdin:
//   {"tokenizer_dir": "...", "texts": ["..."], "add_special_tokens": true,
//    "decode": [[ids...], ...],           // optional: id lists to decode as-is
//    "nfc": ["..."]}                      // optional: strings to NFC-normalize
// and prints one JSON object on stdout:
//   {"ids": [[...]], "decoded": ["..."], "decoded_with_special": ["..."],
//    "decode_results": [{"skip": "...", "keep": "..."}], "nfc": ["..."]}
// where decoded[i] = decode(ids[i], skip_special_tokens=true) and decoded_with_special[i]
// the same with skip_special_tokens=false.
//
// The tokenizer comes from @lenml/tokenizers (a dependency-free port of transformers.js's
// tokenizers), loaded from the directory's tokenizer.json + tokenizer_config.json.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { TokenizerLoader } from "@lenml/tokenizers";

function readJson(path, fallback) {
  try {
    return JSON.parse(readFileSync(path, "utf8"));
  } catch (e) {
    if (fallback !== undefined && e.code === "ENOENT") return fallback;
    throw e;
  }
}

const request = JSON.parse(readFileSync(0, "utf8"));
const dir = request.tokenizer_dir;
const tokenizer = TokenizerLoader.fromPreTrained({
  tokenizerJSON: readJson(join(dir, "tokenizer.json")),
  tokenizerConfig: readJson(join(dir, "tokenizer_config.json"), {}),
});
const addSpecial = request.add_special_tokens ?? true;

// decode() of the library refuses an empty id list; HF returns "".
const decode = (ids, skip) =>
  ids.length === 0 ? "" : tokenizer.decode(ids, { skip_special_tokens: skip });

const out = { ids: [], decoded: [], decoded_with_special: [], decode_results: [], nfc: [] };
for (const text of request.texts ?? []) {
  const ids = tokenizer.encode(text, { add_special_tokens: addSpecial });
  out.ids.push(ids);
  out.decoded.push(decode(ids, true));
  out.decoded_with_special.push(decode(ids, false));
}
for (const ids of request.decode ?? []) {
  out.decode_results.push({ skip: decode(ids, true), keep: decode(ids, false) });
}
for (const text of request.nfc ?? []) out.nfc.push(text.normalize("NFC"));
process.stdout.write(JSON.stringify(out));
