// tokenize_peer.mjs — the peer of bench/tokenize_speed: tiktoken (its Rust
// core as WASM) encoding the same text, cut the same way (64 KiB chunks
// ending at a newline), on one core. Ranks are rebuilt from tokenizer.json's
// vocabulary (for Llama 3 and GPT-2 they are the tokenizer's own ranks) and
// the pattern is the file's Split regex, or GPT-2's for ByteLevel(use_regex).
// Byte-level tokenizers only; tiktoken does not run normalizers (NFC).
//
//   node tokenize_peer.mjs TOKENIZER_DIR TEXT_FILE SECONDS   (from a folder
//   where `npm install tiktoken` was run; bench/tokenize_speed.sh does this)
// Prints one JSON line: {"bytes", "tokens", "passes", "seconds", "mb_per_s"}.
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";

const require = createRequire(process.cwd() + "/");
const { Tiktoken } = require("tiktoken/lite");
const [dir, textPath, secondsArg] = process.argv.slice(2);
const tj = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));

const byteToChar = new Map();
{
  let n = 0;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
    byteToChar.set(printable ? String.fromCodePoint(b) : String.fromCodePoint(0x100 + n++), b);
  }
}
const GPT2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
let pat = null, byteLevel = false;
const pre = tj.pre_tokenizer || {};
for (const p of pre.type === "Sequence" ? pre.pretokenizers : [pre]) {
  if (p.type === "Split") pat = p.pattern.Regex;
  if (p.type === "ByteLevel") {
    byteLevel = true;
    if (p.use_regex !== false) pat = GPT2;
  }
}
if (!byteLevel || !pat) {
  console.log(JSON.stringify({ error: "not a byte-level tokenizer with a split pattern: no tiktoken peer" }));
  process.exit(0);
}
const lines = [];
for (const [k, id] of Object.entries(tj.model.vocab)) {
  const bytes = [];
  let ok = true;
  for (const c of k) {
    if (!byteToChar.has(c)) { ok = false; break; }
    bytes.push(byteToChar.get(c));
  }
  if (ok) lines.push(`${Buffer.from(bytes).toString("base64")} ${id}`);
}
const enc = new Tiktoken(lines.join("\n") + "\n", {}, pat);

const buf = fs.readFileSync(textPath);
const chunks = [];
for (let p = 0; p < buf.length; ) {
  let e = Math.min(p + 65536, buf.length);
  while (e < buf.length && buf[e - 1] !== 0x0a) e++;
  chunks.push(buf.subarray(p, e).toString("utf8"));
  p = e;
}
let tokens = 0;
for (const c of chunks) tokens += enc.encode_ordinary(c).length;
const seconds = Number(secondsArg || 3);
const t0 = process.hrtime.bigint();
let passes = 0, el = 0;
do {
  for (const c of chunks) enc.encode_ordinary(c);
  passes++;
  el = Number(process.hrtime.bigint() - t0) / 1e9;
} while (el < seconds);
enc.free();
console.log(JSON.stringify({ bytes: buf.length, tokens, passes, seconds: el,
  mb_per_s: (buf.length * passes) / el / 1e6 }));
