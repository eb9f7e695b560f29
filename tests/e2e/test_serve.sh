#!/usr/bin/env bash
# lattice serve as a user runs it: a trained checkpoint served over HTTP on a free port; Megatron's
# PUT /api giving, for a seed, the bytes `lattice generate --seed` prints; OpenAI's /v1/completions
# scoring a prompt (echo, logprobs) and cutting at a stop string; /v1/chat/completions answering what
# /v1/completions answers for the text `lattice chat-template` prints; a bad request answered 400 with the
# field named while the server goes on; the emulated GPU serving the CPU's tokens; a port in use and a
# missing checkpoint refused in one line; SIGTERM stopping it with exit 0.
#   bash tests/e2e/test_serve.sh <path to lattice binary> <source dir>
set -u -o pipefail
source "$(dirname "$0")/lib.sh"
e2e_init "$@"
cd "$TMP" || exit 1

run train "$LATTICE" train --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 \
  --max-position-embeddings 160 --micro-batch-size 2 --global-batch-size 2 --train-iters 3 \
  --lr 1e-2 --min-lr 1e-2 --log-interval 1 --seed 7 --mock-data --tokenizer-type ByteTokenizer --save ckpt || e2e_finish

# start_server NAME [FLAGS...]: lattice serve on a free port, in the background; sets PORT and PID.
start_server() {
  local name=$1
  shift
  "$LATTICE" serve --load ckpt --port 0 --batch-size 2 "$@" >"$name.out" 2>"$name.err" &
  PID=$!
  if ! wait_for "$name.err" 'on http://127\.0\.0\.1:[0-9]+' 60; then
    fail "$name: the server did not say where it listens: $(cat "$name.err")"
    kill "$PID" 2>/dev/null
    return 1
  fi
  PORT=$(grep -oE 'http://127\.0\.0\.1:[0-9]+' "$name.err" | head -n 1 | sed 's/.*://')
}

# client NAME SCRIPT: runs the Python SCRIPT with call(method, path, body) -> (status, text) against PORT.
client() {
  local name=$1
  /usr/bin/python3 - "$PORT" >"$name.py.out" 2>"$name.py.err" <<EOF
import json, sys, urllib.request, urllib.error
PORT = sys.argv[1]
def call(method, path, body=None, headers={}):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request("http://127.0.0.1:%s%s" % (PORT, path), data=data, method=method,
                                 headers=dict({"Content-Type": "application/json"}, **headers))
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
$2
EOF
}

# Both prompts' tokens of a PUT /api (seed 42) as bytes, a line each: what generate --prompt-file prints.
TWO_PROMPTS='
status, text = call("PUT", "/api", {"prompts": ["In the beginning", "And God said"], "tokens_to_generate": 20,
                                     "random_seed": 42})
r = json.loads(text)
sys.stdout.buffer.write(b"".join(bytes(t) + b"\n" for t in r["tokens"]))
'

# A chat template (ChatML's form) in a tokenizer_config.json, as a chat model's folder holds it.
mkdir -p chatdir
cat >chatdir/tokenizer_config.json <<'JSON'
{"eos_token": "<|im_end|>", "chat_template": "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"}
JSON
printf '[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "In the beginning"}]' >chat.json
"$LATTICE" chat-template --chat-template chatdir --add-generation-prompt <chat.json >chat.txt 2>chat.err ||
  fail "lattice chat-template: $(cat chat.err)"

if start_server serve --chat-template chatdir; then
  # ---- PUT /api: each prompt's bytes are generate's for the same seed and prompt position ----
  printf 'In the beginning\nAnd God said\n' >prompts.txt
  run gen0 "$LATTICE" generate --load ckpt --prompt "In the beginning" --max-new-tokens 20 --seed 42
  if client api '
status, text = call("PUT", "/api", {"prompts": ["In the beginning", "And God said"], "tokens_to_generate": 20,
                                     "random_seed": 42, "logprobs": True})
assert status == 200, (status, text)
r = json.loads(text)
assert len(r["tokens"]) == 2 and len(r["segments"][0]) == len(r["tokens"][0]), r
assert len(r["logprobs"][0]) == len(r["tokens"][0]) - 1, r
assert all(lp <= 0 for lp in r["logprobs"][0] + r["logprobs"][1]), r
sys.stdout.buffer.write(bytes(r["tokens"][0]) + b"\n")
'; then
    if cmp -s api.py.out gen0.out; then
      pass "PUT /api with random_seed 42 gives generate --seed 42's bytes for its first prompt"
    else
      fail "PUT /api: $(od -c api.py.out | head -3) against generate: $(od -c gen0.out | head -3)"
    fi
  else
    fail "PUT /api: $(cat api.py.err)"
  fi
  # The second prompt is generate's second: --prompt-file with both, its second line's bytes.
  run gen_file "$LATTICE" generate --load ckpt --prompt-file prompts.txt --max-new-tokens 20 --seed 42 --batch-size 2
  if client api2 "$TWO_PROMPTS" && cmp -s api2.py.out gen_file.out; then
    pass "PUT /api with two prompts gives generate --prompt-file's bytes"
  else
    fail "PUT /api with two prompts: $(cat api2.py.err) $(od -c api2.py.out | head -3) against $(od -c gen_file.out | head -3)"
  fi

  # ---- OpenAI completions: scoring with echo, a stop string, a bad request, the server still up ----
  if client completions '
status, text = call("POST", "/v1/completions", {"model": "ckpt", "prompt": "Let there be light", "max_tokens": 1,
                                                 "logprobs": 1, "echo": True, "temperature": 0})
assert status == 200, (status, text)
c = json.loads(text)["choices"][0]
lp = c["logprobs"]
new = 0 if c["finish_reason"] == "stop" else 1  # (the tiny model may end the document at once)
assert len(lp["tokens"]) == len("Let there be light") + new and len(lp["text_offset"]) == len(lp["tokens"]), c
assert lp["token_logprobs"][0] is None and all(x <= 0 for x in lp["token_logprobs"][1:]), lp
assert c["text"].startswith("Let there be light"), c
status, text = call("POST", "/v1/completions", {"prompt": [[76, 101], [116]], "max_tokens": 8, "temperature": 0})
assert status == 200 and len(json.loads(text)["choices"]) == 2, (status, text)
status, text = call("POST", "/v1/completions", {"prompt": "x", "max_tokens": 4, "n": 3, "best_of": 5})
assert status == 400 and "best_of other than n" in json.loads(text)["error"]["message"], (status, text)
status, text = call("PUT", "/api", {"prompts": ["x"], "top_k": 5000})
assert status == 400 and text.strip() == "top_k must be an integer in [0, 1000], got 5000", (status, text)
status, text = call("GET", "/v1/models")
assert status == 200 and json.loads(text)["data"][0]["id"] == "ckpt", (status, text)
body = {"prompt": "In the", "max_tokens": 12, "seed": 3}
req = urllib.request.Request("http://127.0.0.1:%s/v1/completions" % PORT, method="POST",
                             data=json.dumps(dict(body, stream=True)).encode(),
                             headers={"Content-Type": "application/json"})
with urllib.request.urlopen(req, timeout=120) as r:
    assert r.headers["Content-Type"].startswith("text/event-stream"), r.headers
    events = [e for e in r.read().decode().split("\n\n") if e]
assert events[-1] == "data: [DONE]", events
chunks = [json.loads(e[len("data: "):])["choices"][0] for e in events[:-1]]
status, text = call("POST", "/v1/completions", body)
want = json.loads(text)["choices"][0]
assert "".join(c["text"] for c in chunks) == want["text"], (chunks, want)
assert chunks[-1]["finish_reason"] == want["finish_reason"], (chunks, want)
'; then
    pass "/v1/completions scores an echoed prompt, takes token-id prompts, streams the text, refuses best_of 5 and top_k 5000"
  else
    fail "/v1/completions: $(cat completions.py.err)"
  fi

  # ---- chat completions: the completion of the template's text (lattice chat-template's), streamed too ----
  grep -q 'POST /v1/chat/completions (chatdir/tokenizer_config.json, tool calls: none)' serve.err ||
    fail "the startup line does not name the chat endpoint and its template: $(head -n 1 serve.err)"
  if client chat "
messages = json.load(open('chat.json'))
text = open('chat.txt').read()
assert text.endswith('<|im_start|>assistant\\n'), repr(text)
body = {'max_tokens': 12, 'temperature': 0.7, 'seed': 9}
status, out = call('POST', '/v1/completions', dict(body, prompt=text))
assert status == 200, (status, out)
want = json.loads(out)['choices'][0]
status, out = call('POST', '/v1/chat/completions', dict(body, messages=messages))
assert status == 200, (status, out)
got = json.loads(out)
assert got['object'] == 'chat.completion' and got['choices'][0]['message']['role'] == 'assistant', got
assert got['choices'][0]['message']['content'] == want['text'], (got, want)
assert got['usage']['prompt_tokens'] == len(text.encode()), got
# the answer's exact bytes (a text's bytes that are no UTF-8 come as U+FFFD): logprobs' bytes of each token
status, out = call('POST', '/v1/chat/completions', dict(body, messages=messages, logprobs=True))
entries = json.loads(out)['choices'][0]['logprobs']['content']
answer = b''.join(bytes(e['bytes']) for e in entries)
assert answer.decode('utf-8', 'replace') == got['choices'][0]['message']['content'], (answer, got)
open('chat_answer.txt', 'wb').write(text.encode() + answer + b'\\n')
req = urllib.request.Request('http://127.0.0.1:%s/v1/chat/completions' % PORT, method='POST',
                             data=json.dumps(dict(body, messages=messages, stream=True)).encode(),
                             headers={'Content-Type': 'application/json'})
with urllib.request.urlopen(req, timeout=120) as r:
    events = [e for e in r.read().decode().split('\\n\\n') if e]
assert events[-1] == 'data: [DONE]', events
chunks = [json.loads(e[len('data: '):])['choices'][0] for e in events[:-1]]
assert chunks[0]['delta']['role'] == 'assistant', chunks[0]
assert ''.join(c['delta'].get('content', '') for c in chunks) == want['text'], (chunks, want)
status, out = call('POST', '/v1/chat/completions', {'messages': [{'role': 'user', 'content': [{'type': 'image_url'}]}]})
assert status == 400 and 'only {\"type\": \"text\"' in json.loads(out)['error']['message'], (status, out)
"; then
    pass "/v1/chat/completions answers what /v1/completions answers for lattice chat-template's text, streamed too"
  else
    fail "/v1/chat/completions: $(cat chat.py.err)"
  fi
  # generate --chat: the template's text, then the answer the server gave for the same seed
  if run gen_chat "$LATTICE" generate --load ckpt --chat --chat-template chatdir --system "Be brief." \
       --prompt "In the beginning" --max-new-tokens 12 --temperature 0.7 --seed 9 && cmp -s gen_chat.out chat_answer.txt; then
    pass "generate --chat --system prints the template's text and the chat completion's answer"
  else
    fail "generate --chat: $(od -c gen_chat.out | head -3) against $(od -c chat_answer.txt 2>/dev/null | head -3)"
  fi

  # ---- a second server on the same port: one line naming the port ----
  expect_error "serve on a port in use" "--port $PORT|cannot listen" -- "$LATTICE" serve --load ckpt --port "$PORT"

  # ---- SIGTERM: exit 0 ----
  kill -TERM "$PID"
  rc=0
  wait "$PID" || rc=$?
  if [ "$rc" -eq 0 ] && grep -q "stopped by signal 15" serve.err; then
    pass "SIGTERM stops the server, exit 0"
  else
    fail "SIGTERM: exit $rc, $(tail -n 2 serve.err)"
  fi
fi

# ---- --api-key (here from $LATTICE_API_KEY): the key in Authorization or 401 ----
if LATTICE_API_KEY=s3cret start_server serve_key; then
  if client key '
status, text = call("PUT", "/api", {"prompts": ["x"], "tokens_to_generate": 2})
assert status == 401 and "Authorization: Bearer" in text, (status, text)
status, text = call("PUT", "/api", {"prompts": ["x"], "tokens_to_generate": 2}, {"Authorization": "Bearer s3cret"})
assert status == 200 and len(json.loads(text)["tokens"][0]) == 3, (status, text)
status, text = call("GET", "/health")
assert status == 200, (status, text)
'; then
    pass "LATTICE_API_KEY: 401 without the key, the answer with it, /health open"
  else
    fail "--api-key: $(cat key.py.err)"
  fi
  kill -TERM "$PID"
  wait "$PID"
fi

# ---- the emulated GPU (the CPU's kernels over device buffers) serves the CPU's bytes ----
if LATTICE_EMULATE_CUDA=1 start_server serve_cuda --device cuda; then
  if client cuda "$TWO_PROMPTS" && cmp -s cuda.py.out gen_file.out; then
    pass "--device cuda (emulated) serves the CPU's bytes"
  else
    fail "--device cuda (emulated): $(cat cuda.py.err) $(cat serve_cuda.err)"
  fi
  kill -TERM "$PID"
  wait "$PID"
fi

expect_error "serve without a checkpoint" "missing|no such checkpoint" -- "$LATTICE" serve --load missing --port 0
expect_error "serve --port 70000" "--port must be in [0, 65535]" -- "$LATTICE" serve --load ckpt --port 70000
expect_error "serve --batch-size 0" "--batch-size must be an integer >= 1" -- "$LATTICE" serve --load ckpt --batch-size 0
expect_error "serve --api-key ''" "--api-key is empty" -- "$LATTICE" serve --load ckpt --api-key ""
expect_error "generate --chat without a template" "--chat|no chat template|--chat-template" -- \
  "$LATTICE" generate --load ckpt --chat --prompt x
expect_error "generate --system without --chat" "--system goes with --chat" -- \
  "$LATTICE" generate --load ckpt --system x --prompt x
expect_error "serve --tool-call-parser qwen" "--tool-call-parser qwen: expected auto, hermes, llama3_json, mistral or none" -- \
  "$LATTICE" serve --load ckpt --port 0 --chat-template chatdir --tool-call-parser qwen
expect_error "serve --tool-call-parser without a template" "--tool-call-parser|chat template" -- \
  "$LATTICE" serve --load ckpt --port 0 --tool-call-parser hermes
expect_error "serve --chat-template with a syntax error" "--chat-template|bad.jinja|line 1" -- \
  bash -c "printf '{%% if x %%}' > bad.jinja && '$LATTICE' serve --load ckpt --port 0 --chat-template bad.jinja"
e2e_finish
