// `lattice serve --load CKPT [--host H] [--port N] [--batch-size B] [--bf16] [--seed S] [--served-model-name NAME]
//  [tokenizer flags] [--device cpu|cuda]`: serves text generation over HTTP: Megatron-LM's PUT /api
// (tools/run_text_generation_server.py's) and OpenAI's completions API (POST /v1/completions, also
// /completions; chat completions; GET /v1/models; vLLM's /tokenize and /detokenize), the ones evaluation
// harnesses speak. What the endpoints answer is
// serve/text_generation_service.h's; this file puts it behind cpp-httplib's server.
//
// SIGINT and SIGTERM stop the server: the requests in hand are answered, then it exits 0.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include <httplib.h>

#include "cli/generation_setup.h"
#include "data/generation_config.h"
#include "cli/subcommands.h"
#include "core/device.h"
#include "core/error.h"
#include "serve/text_generation_service.h"
#include "serve/tool_calls.h"
#include "train/exit_signal.h"

namespace lattice {

int cmd_serve(int argc, char** argv) {
  if (help_requested(argc, argv, 2)) {
    std::fputs(
        "usage: lattice serve --load CKPT [flags]\n"
        "Serves text generation over HTTP: Megatron-LM's PUT /api and OpenAI's POST /v1/completions\n"
        "(also /completions), POST /v1/chat/completions (also /chat/completions), GET /v1/models, and vLLM's\n"
        "POST /tokenize and /detokenize (also under /v1)\n"
        "(docs/convert-and-generate.md#lattice-serve).\n"
        "  --host H                   address to listen on (0.0.0.0: every interface) [127.0.0.1]\n"
        "  --port N                   port (0: any free one, printed) [5000]\n"
        "  --batch-size B             prompts decoded together, across requests [8]\n"
        "  --bf16                     decode with the linear layers' weights and inputs in bf16\n"
        "  --seed S                   sampling seed of requests without one: S, S + 1, ... [1234]\n"
        "  --served-model-name NAME   the completions API's model name [the --load directory]\n"
        "  --api-key KEY              requests (but GET /health) must send Authorization: Bearer KEY\n"
        "                             [$LATTICE_API_KEY, else none]\n"
        "  --chat-template PATH       POST /v1/chat/completions' template: a Jinja file, a tokenizer_config.json or\n"
        "                             their folder [the tokenizer's folder's, when it has one]\n"
        "  --tool-call-parser P       how chat completions find the model's tool calls in its text: hermes\n"
        "                             (<tool_call>: Qwen, Hermes), llama3_json (Llama 3.1+), mistral ([TOOL_CALLS]),\n"
        "                             none, or auto: the form the chat template teaches [auto]\n",
        stdout);
    std::fputs(kGenerationModelFlagsHelp, stdout);
    return 0;
  }
  start_exit_signal_watcher();  // before any other thread: SIGINT/SIGTERM stop the server, below
  std::set<std::string> value_flags = {"host", "port", "batch-size", "seed", "served-model-name", "api-key",
                                       "chat-template", "tool-call-parser"};
  value_flags.insert(generation_model_flags().begin(), generation_model_flags().end());
  const SimpleFlags f = parse_simple_flags(argc, argv, 2, value_flags, {"bf16"});
  const std::string host = f.get("host", "127.0.0.1");
  const int64_t port = integer_flag(f, "port", 5000, 0);
  if (port > 65535) LATTICE_FAIL() << "--port must be in [0, 65535], got " << port;
  ServeOptions options;
  options.sequences = integer_flag(f, "batch-size", 8, 1);
  options.bf16 = f.has("bf16");
  options.seed = uint64_t(integer_flag(f, "seed", 1234, 0));
  options.model_name = f.get("served-model-name", f.required("load"));
  // --api-key, else $LATTICE_API_KEY (which, unlike a flag, other users' `ps` does not show)
  const char* env_key = std::getenv("LATTICE_API_KEY");
  options.api_key = f.get("api-key", env_key ? env_key : "");
  if (f.has("api-key") && options.api_key.empty()) LATTICE_FAIL() << "--api-key is empty";

  GenerationModel g = load_generation_model(f);
  options.chat_template = find_chat_template(f, g);
  options.tool_call_parser = f.get("tool-call-parser", "auto");
  options.stop_tokens = generation_stop_tokens(*g.tokenizer, g.tokenizer_spec.model);
  if (f.has("tool-call-parser") && !options.chat_template)
    LATTICE_FAIL() << "--tool-call-parser reads chat completions, which need a chat template (--chat-template)";
  const ToolCallFormat tool_calls = tool_call_format(
      options.tool_call_parser, options.chat_template ? options.chat_template->text() : "", "--tool-call-parser");
  const std::string chat_note = options.chat_template ? "POST /v1/chat/completions (" + options.chat_template->source() +
                                                            ", tool calls: " + tool_call_format_name(tool_calls) + "), "
                                                      : "";
  TextGenerationService service(*g.loaded.model, *g.tokenizer, options);

  httplib::Server server;
  server.set_payload_max_length(size_t(64) << 20);
  // A connection holds a thread while its request waits for its tokens: enough of them that --batch-size
  // requests can decode together with as many more waiting (httplib's default: max(8, cores - 1)).
  const size_t threads = size_t(std::max<int64_t>(8, 2 * options.sequences));
  server.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, under which a second server binds a port
  // in use and the two share its connections.
  server.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  auto route = [&](const httplib::Request& req, httplib::Response& res) {
    HttpReply reply = service.handle(req.method, req.path, req.body, req.get_header_value("Authorization"));
    res.status = reply.status;
    if (!reply.stream) {
      res.set_content(reply.body, reply.content_type.c_str());
      return;
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(reply.content_type, [stream = std::move(reply.stream)](size_t, httplib::DataSink& sink) {
      stream([&](const std::string& piece) { return sink.is_writable() && sink.write(piece.data(), piece.size()); });
      sink.done();
      return true;
    });
  };
  for (const char* path :
       {"/api", "/completions", "/v1/completions", "/chat/completions", "/v1/chat/completions", "/v1/models", "/health"}) {
    server.Get(path, route);
    server.Put(path, route);
    server.Post(path, route);
  }
  server.set_error_handler([&](const httplib::Request& req, httplib::Response& res) {
    if (res.status != 404 || !res.body.empty()) return;
    const HttpReply reply =  // the 404 naming the endpoints
        service.handle(req.method, req.path, req.body, req.get_header_value("Authorization"));
    res.set_content(reply.body, reply.content_type.c_str());
  });
  const int bound = port == 0 ? server.bind_to_any_port(host) : (server.bind_to_port(host, int(port)) ? int(port) : -1);
  if (bound < 0)
    LATTICE_FAIL() << "--host " << host << " --port " << port << ": cannot listen there (in use, or not an address of this machine)";

  std::atomic<bool> done{false};
  std::thread stopper([&] {  // the signal watcher's news, to the server
    while (!done.load() && !exit_signal_received()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    server.stop();
  });
  std::fprintf(stderr,
               "serve: %s (%s; KV cache of %lld sequences x %lld tokens, %.1f MB%s%s) on http://%s:%d: PUT /api, "
               "POST /v1/completions, %sGET /v1/models, POST /tokenize, POST /detokenize\n",
               options.model_name.c_str(), g.tokenizer->name(), (long long)options.sequences,
               (long long)g.loaded.model->config().max_position_embeddings, double(service.generator_bytes()) / 1e6,
               options.bf16 ? ", bf16 weights" : "", current_device() == Device::cpu ? "" : ", cuda", host.c_str(), bound,
               chat_note.c_str());
  const bool ok = server.listen_after_bind();
  done = true;
  stopper.join();
  if (exit_signal_received()) {
    std::fprintf(stderr, "serve: stopped by signal %d\n", exit_signal_received());
    return 0;
  }
  if (!ok) LATTICE_FAIL() << "--port " << bound << ": the server stopped unexpectedly";
  return 0;
}

}  // namespace lattice
