// A Jinja2 template engine for HuggingFace chat templates: renders what Python's jinja2 3.1 renders with
// transformers' settings, ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
// extensions=[loopcontrols]), no autoescape, the default Undefined, plus transformers' raise_exception(),
// strftime_now() and tojson (json.dumps with ensure_ascii=False), and its {% generation %} block.
//
// Supported:
//  - syntax: text, {{ }}, {% %}, {# #}, whitespace control (-, +, trim_blocks, lstrip_blocks), {% raw %};
//    literals (str with Python escapes, int, float, true/false/none in both cases, lists, tuples, dicts);
//    operators with jinja2's precedence: or and not, in / not in, is [not] test, == != < <= > >= (chained),
//    ~ + - * / // % ** (Python semantics; str % args formats), unary - +, filters, a if c else b,
//    .attr, [item], [start:stop:step], calls with positional and keyword arguments.
//  - statements: if/elif/else, for (unpacking, `if` filter, else, loop.index/index0/revindex/revindex0/first/
//    last/length/previtem/nextitem/depth/cycle()), break, continue, set (names, unpacking, ns.attr), block set
//    (with a filter), macro (defaults, varargs, kwargs), filter blocks, with, generation.
//  - scoping as jinja2: each for-loop iteration and macro call has its own scope, `if` has none; namespace()
//    objects carry values out of loops.
//  - filters: abs attr capitalize center count d default dictsort e escape first float forceescape format indent
//    int items join last length list lower map max min reject rejectattr replace reverse round safe select
//    selectattr sort string sum title tojson trim truncate unique upper wordcount.
//  - tests: defined undefined none boolean true false integer float number string mapping iterable sequence
//    callable even odd divisibleby eq equalto ne lt le gt ge in sameas lower upper escaped filter test
//    (and the operator aliases ==, !=, <, <=, >, >=, lessthan, greaterthan).
//  - methods: str.strip/lstrip/rstrip/split/rsplit/splitlines/startswith/endswith/upper/lower/title/capitalize/
//    swapcase/replace/find/rfind/index/rindex/count/join/removeprefix/removesuffix/partition/rpartition/format
//    ({} fields without format specs)/isdigit/isalpha/isalnum/isspace/islower/isupper; dict.items/keys/values/
//    get/copy; list.index/count/copy. Mutating methods (list.append, dict.update, ...) raise the sandbox's
//    SecurityError, as in transformers.
//  - globals: range, namespace, dict, raise_exception, strftime_now.
// Not supported: include/import/extends/block/call tags, recursive loops, loop.changed, *args/**kwargs in calls,
// the cycler/joiner/lipsum globals, and the filters batch, slice, groupby, wordwrap, urlencode, xmlattr, pprint,
// striptags and filesizeformat.
//
// Known differences from Python:
//  - ints are 64-bit: arithmetic overflow is an error, and a JSON integer above 2^63-1 becomes a float;
//  - an unknown filter or test is an error when evaluated; jinja2 reports it when the template is compiled,
//    unless it sits inside an if or for;
//  - a macro accepts extra arguments as varargs/kwargs even when its body does not use them;
//  - str.format() takes no format specs ("{:.2f}");
//  - range() gives a list (printed as [0, 1], not range(0, 2)); a bound method prints as <function name>;
//  - case mapping is the C library's simple Unicode mapping ("ß".upper() stays "ß");
//  - repr() escapes the common non-printable characters only.
//
// Dicts keep the order of the JSON they come from: render(nlohmann::ordered_json) keeps the request's key order
// (as Python does); render(nlohmann::json) sees keys sorted, as nlohmann::json stores them.
// A Template is immutable after construction: copies share the parsed tree, and render() may run concurrently.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace lattice::jinja {

class Template {
 public:
  // Parses `source`. A syntax error throws lattice::Error: "<name> line L: <what>", e.g.
  // "chat template line 3: unexpected 'endfor', expected 'elif', 'else' or 'endif' (...)".
  explicit Template(std::string_view source, std::string name = "chat template");
  ~Template();
  Template(const Template&);
  Template& operator=(const Template&);
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with `variables`, a JSON object (messages, add_generation_prompt, bos_token, tools, ...). A runtime
  // error throws lattice::Error "<name> line L: <what>"; raise_exception(msg) throws "<name>: <msg>".
  std::string render(const nlohmann::json& variables) const;
  std::string render(const nlohmann::ordered_json& variables) const;

  const std::string& name() const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

}  // namespace lattice::jinja
