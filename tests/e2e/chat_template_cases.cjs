// Writes the chat-template conformance cases: every real model's chat template that
// @huggingface/ollama-utils ships (src/chat-template-automap.ts: the Jinja template found in each
// model's GGUF file, as on the HuggingFace hub) rendered with several conversations.
// usage: node chat_template_cases.cjs NPM_DIR > cases.jsonl
//   one line per case: {"model", "template", "variables"}; variables as apply_chat_template passes
//   them: the special tokens, messages, add_generation_prompt, and tools in one conversation.
const fs = require("fs");
const path = require("path");

const npmDir = process.argv[2];
const source = fs.readFileSync(
  path.join(npmDir, "node_modules/@huggingface/ollama-utils/src/chat-template-automap.ts"), "utf8");
// The file is one TypeScript constant, an array literal: drop the type import and annotation.
const body = source.replace(/^import type .*$/m, "").replace(/export const OLLAMA_CHAT_TEMPLATE_MAPPING:[^=]*=/, "return");
const mapping = new Function(body)();

const special = { bos_token: "<s>", eos_token: "</s>", unk_token: "<unk>", pad_token: "<pad>" };
const tools = [{
  type: "function",
  function: {
    name: "get_weather",
    description: "The weather in a city",
    parameters: { type: "object", properties: { city: { type: "string", description: "The city" } }, required: ["city"] },
  },
}];
const conversations = [
  { messages: [{ role: "user", content: "Hello!" }], add_generation_prompt: true },
  {
    messages: [
      { role: "system", content: "You are a helpful assistant." },
      { role: "user", content: "What is 2 + 2?" },
      { role: "assistant", content: " It is 4. " },
      { role: "user", content: "And 3 + 3?\nThanks, \u00e9t\u00e9 \u{1F600}" },
    ],
    add_generation_prompt: true,
  },
  {
    messages: [{ role: "user", content: "Hi" }, { role: "assistant", content: "Hello, how can I help?" }],
    add_generation_prompt: false,
  },
  { messages: [{ role: "user", content: "Weather in Paris?" }], add_generation_prompt: true, tools },
];

let seen = new Set();
for (const entry of mapping) {
  if (typeof entry.gguf !== "string" || seen.has(entry.gguf)) continue;  // the same template under two names once
  seen.add(entry.gguf);
  for (const c of conversations)
    process.stdout.write(JSON.stringify({ model: entry.model, template: entry.gguf, variables: { ...special, ...c } }) + "\n");
}
