// customops_serve: the inference step of a C++ service for a model that uses customops' ops.
//
//   customops_serve MODEL INPUT OUTPUT [--device cpu|cuda] [--runs N] [--warmup N]
//
// MODEL is TorchScript (.pt, torch::jit::load) or an AOTInductor package (.pt2,
// AOTIModelPackageLoader). INPUT is a tensor written by Python's torch.save; OUTPUT is written
// with torch::pickle_save, so Python's torch.load reads it. Prints the median and p99 latency
// of N runs in milliseconds. Exits non-zero with a message, never a crash, on bad files.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/cuda.h>
#include <torch/script.h>
#include <torch/serialize.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

struct Args {
  std::string model, input, output, device = "cpu";
  int runs = 100, warmup = 10;
};

[[noreturn]] void usage(const char* why) {
  std::cerr << "customops_serve: " << why << "\n"
            << "usage: customops_serve MODEL(.pt|.pt2) INPUT OUTPUT [--device cpu|cuda] [--runs N] [--warmup N]\n";
  std::exit(2);
}

int parse_int(const std::string& text, const std::string& option) {
  size_t used = 0;
  const int v = std::stoi(text, &used);
  if (used != text.size()) usage(("bad number for " + option + ": " + text).c_str());
  return v;
}

Args parse(int argc, char** argv) {
  Args a;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value for " + arg).c_str());
      return argv[++i];
    };
    try {
      if (arg == "-h" || arg == "--help") usage("runs a model that uses customops' ops on one input");
      else if (arg == "--device") a.device = value();
      else if (arg == "--runs") a.runs = parse_int(value(), arg);
      else if (arg == "--warmup") a.warmup = parse_int(value(), arg);
      else if (arg.rfind("--", 0) == 0) usage(("unknown option " + arg).c_str());
      else positional.push_back(arg);
    } catch (const std::logic_error&) {
      usage(("bad number for " + arg).c_str());
    }
  }
  if (positional.size() != 3) usage("expected MODEL INPUT OUTPUT");
  if (a.runs < 1 || a.warmup < 0) usage("--runs must be >= 1 and --warmup >= 0");
  a.model = positional[0];
  a.input = positional[1];
  a.output = positional[2];
  return a;
}

std::vector<char> read_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(std::string(what) + " file '" + path + "' cannot be opened");
  try {
    return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  } catch (const std::exception& e) {  // a directory, say
    throw std::runtime_error(std::string(what) + " file '" + path + "' cannot be read: " + e.what());
  }
}

// Built with std::to_string: see csrc/ops/common/checks.h on integer streaming.
std::string shape_str(at::IntArrayRef sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + std::to_string(sizes[i]);
  return out + "]";
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The op library is linked with --no-as-needed, so its TORCH_LIBRARY registrations ran at
// start-up; say so plainly if they did not. customops::_build_info is registered with every
// op's schema (csrc/registration.cpp): present, the library is loaded, whatever ops it has.
void require_customops_ops() {
  if (!c10::Dispatcher::singleton().findSchema({"customops::_build_info", ""}).has_value()) {
    throw std::runtime_error(
        "the customops op library is not loaded (no customops:: operator is registered). Link it (CMake: "
        "target_link_libraries(app customops::customops)) or load it (Python: import customops; "
        "its path is customops.library_path())");
  }
}

// Torch's own message names the missing op; add how to get it.
std::string explain(const std::string& message) {
  const bool missing_op = message.find("Unknown builtin op: customops::") != std::string::npos ||
                          message.find("Could not find schema for customops::") != std::string::npos;
  if (missing_op && message.find("op library is not loaded") == std::string::npos) {
    return message +
           "\nThe model uses customops ops, but the customops op library is not loaded: link it (CMake: "
           "find_package(customops), target_link_libraries(app customops::customops)) or load it "
           "(Python: import customops; its path is customops.library_path()).";
  }
  return message;
}

// Python's names for dtypes, as customops.export's metadata has them.
std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kLong: return "int64";
    case at::kInt: return "int32";
    case at::kShort: return "int16";
    case at::kChar: return "int8";
    case at::kByte: return "uint8";
    case at::kBool: return "bool";
    default: return c10::toString(t);
  }
}

// s's comma-separated fields (none for an empty s).
std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> fields;
  for (size_t start = 0; !s.empty() && start <= s.size();) {
    const size_t end = std::min(s.find(',', start), s.size());
    fields.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return fields;
}

// x checked against a package's "customops_inputs" record ("dtype:dim,dim,..." per input,
// joined by '|', a dim a size "12" or a range "1-65535"). This replaces AOTI_RUNTIME_CHECK_INPUTS=1, which refuses size
// 1 at dims that torch's own packages export as dynamic.
void check_input(const std::string& spec, const at::Tensor& x, const std::string& model) {
  if (spec.find('|') != std::string::npos) {
    throw std::runtime_error(
        "the model takes several inputs (" + spec + "); customops_serve serves models with one tensor input");
  }
  const size_t colon = spec.find(':');
  const std::string dtype = spec.substr(0, colon);
  const std::string dims = colon == std::string::npos ? "" : spec.substr(colon + 1);
  std::vector<int64_t> lows, highs;  // each dim's range; a fixed size has low == high
  try {
    for (const std::string& dim : split_commas(dims)) {
      const size_t dash = dim.find('-');
      lows.push_back(std::stoll(dim.substr(0, dash)));
      highs.push_back(std::stoll(dash == std::string::npos ? dim : dim.substr(dash + 1)));
    }
  } catch (const std::logic_error&) {  // std::stoll's invalid_argument / out_of_range
    throw std::runtime_error("model '" + model + "' has malformed customops_inputs metadata '" + spec + "'");
  }
  bool fits = dtype_name(x.scalar_type()) == dtype && x.dim() == static_cast<int64_t>(lows.size());
  for (int64_t i = 0; fits && i < x.dim(); ++i) fits = lows[i] <= x.size(i) && x.size(i) <= highs[i];
  if (!fits) {
    std::string expected;
    for (const char c : dims) expected += c == ',' ? std::string(", ") : std::string(1, c);
    throw std::runtime_error(
        "model '" + model + "' refused input 0 of shape " + shape_str(x.sizes()) + " and dtype " +
        dtype_name(x.scalar_type()) + ": it expects dtype " + dtype + " and shape [" + expected + "]");
  }
}

// x with exactly the strides of a row-major tensor of its shape: torch calls a tensor
// contiguous whatever the strides of its size-1 dims (an (N, 1, H, W) batch in channels_last,
// say), and AOTInductor's code reads them.
at::Tensor row_major(const at::Tensor& x) {
  std::vector<int64_t> expected(x.dim());
  int64_t stride = 1;
  for (int64_t i = x.dim() - 1; i >= 0; --i) {
    expected[i] = stride;
    stride *= std::max<int64_t>(x.size(i), 1);
  }
  return x.strides() == at::IntArrayRef(expected) ? x : x.clone(at::MemoryFormat::Contiguous);
}

// The value of e, an integer expression of sizes and symbols as sympy prints torch's symbolic
// sizes ("s0", "s1 + 2", "2*s1", "((s1 - 1)//2)"): +, -, *, // (floor division) and parentheses.
// Nothing for anything else (a function of torch's such as "Max(s0, 2)") or a symbol that values
// does not have.
class SizeExpr {
 public:
  static std::optional<int64_t> eval(const std::string& e, const std::map<std::string, int64_t>& values) {
    SizeExpr p(e, values);
    const std::optional<int64_t> v = p.sum();
    return v && p.skip_spaces() == p.e_.size() ? v : std::nullopt;
  }

  // The names in e that values lacks (function names excluded).
  static std::vector<std::string> unknowns(const std::string& e, const std::map<std::string, int64_t>& values) {
    std::vector<std::string> names;
    for (size_t i = 0; i < e.size();) {
      if (!std::isalpha(static_cast<unsigned char>(e[i])) && e[i] != '_') {
        ++i;
        continue;
      }
      const size_t start = i;
      while (i < e.size() && (std::isalnum(static_cast<unsigned char>(e[i])) || e[i] == '_')) ++i;
      const std::string name = e.substr(start, i - start);
      const bool call = i < e.size() && e[i] == '(';
      if (!call && !values.count(name) && std::find(names.begin(), names.end(), name) == names.end()) {
        names.push_back(name);
      }
    }
    return names;
  }

 private:
  SizeExpr(const std::string& e, const std::map<std::string, int64_t>& values) : e_(e), values_(values) {}

  size_t skip_spaces() {
    while (i_ < e_.size() && e_[i_] == ' ') ++i_;
    return i_;
  }
  bool eat(const char* token) {
    skip_spaces();
    const size_t n = std::strlen(token);
    if (e_.compare(i_, n, token) != 0) return false;
    i_ += n;
    return true;
  }
  std::optional<int64_t> sum() {
    std::optional<int64_t> v = product();
    while (v) {
      const int sign = eat("+") ? 1 : eat("-") ? -1 : 0;
      if (sign == 0) break;
      const auto r = product();
      v = r ? std::optional<int64_t>(*v + sign * *r) : std::nullopt;
    }
    return v;
  }
  std::optional<int64_t> product() {
    std::optional<int64_t> v = factor();
    while (v) {
      if (eat("//")) {
        const auto r = factor();
        if (!r || *r == 0) return std::nullopt;
        const int64_t q = *v / *r;
        v = q * *r != *v && (*v < 0) != (*r < 0) ? q - 1 : q;  // Python's floor, not C++'s truncation
      } else if (eat("*")) {
        const auto r = factor();
        v = r ? std::optional<int64_t>(*v * *r) : std::nullopt;
      } else {
        break;
      }
    }
    return v;
  }
  std::optional<int64_t> factor() {
    if (eat("-")) {
      const auto v = factor();
      return v ? std::optional<int64_t>(-*v) : std::nullopt;
    }
    if (eat("(")) {
      const auto v = sum();
      return v && eat(")") ? v : std::nullopt;
    }
    const size_t start = skip_spaces();
    while (i_ < e_.size() && (std::isalnum(static_cast<unsigned char>(e_[i_])) || e_[i_] == '_')) ++i_;
    const std::string word = e_.substr(start, i_ - start);
    if (word.empty()) return std::nullopt;
    if (std::all_of(word.begin(), word.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
      return word.size() <= 18 ? std::optional<int64_t>(std::stoll(word)) : std::nullopt;
    }
    const auto it = values_.find(word);
    if (it == values_.end() || eat("(")) return std::nullopt;
    return it->second;
  }

  const std::string& e_;
  const std::map<std::string, int64_t>& values_;
  size_t i_ = 0;
};

// x checked against a package's "customops_input_dims" record ("dim,dim,..." per input, a size,
// a symbol such as "s0", or an expression of symbols): each symbol takes the size of its first
// dim, and every other dim it determines must have the size that its expression gives (a square
// image's height and width, say), as the compiled code sizes its loops from one of them.
void check_tied_dims(const std::string& dims, const at::Tensor& x, const std::string& model) {
  const std::vector<std::string> exprs = split_commas(dims);
  if (dims.find('|') != std::string::npos || static_cast<int64_t>(exprs.size()) != x.dim()) return;
  const auto is_symbol = [](const std::string& e) {
    return !e.empty() && std::isalpha(static_cast<unsigned char>(e[0])) && std::all_of(e.begin(), e.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
    });
  };
  std::map<std::string, int64_t> values, first;  // symbol -> its size, its first dim
  for (int64_t i = 0; i < x.dim(); ++i) {
    if (is_symbol(exprs[i]) && first.emplace(exprs[i], i).second) values[exprs[i]] = x.size(i);
  }
  for (int64_t i = 0; i < x.dim(); ++i) {
    const auto bare = first.find(exprs[i]);
    if (bare != first.end() && bare->second == i) continue;
    if (exprs[i].find_first_not_of("0123456789") == std::string::npos) continue;  // a size: check_input's
    const std::vector<std::string> unknown = SizeExpr::unknowns(exprs[i], values);
    if (unknown.size() == 1) {  // a symbol with no dim of its own: solve a * s + b = size for it
      std::map<std::string, int64_t> at = values;
      std::array<std::optional<int64_t>, 4> f;
      const std::array<int64_t, 4> points = {0, 1, 2, 7};
      for (size_t k = 0; k < points.size(); ++k) {
        at[unknown[0]] = points[k];
        f[k] = SizeExpr::eval(exprs[i], at);
      }
      if (!f[0] || !f[1] || !f[2] || !f[3]) continue;
      const int64_t b = *f[0], a = *f[1] - *f[0];
      if (a <= 0 || *f[2] != 2 * a + b || *f[3] != 7 * a + b) continue;  // not affine and growing: not checked
      const int64_t r = ((x.size(i) - b) % a + a) % a;  // Python's modulo
      if (r != 0) {
        throw std::runtime_error(
            "model '" + model + "' refused input 0 of shape " + shape_str(x.sizes()) + ": its dim " +
            std::to_string(i) + " is " + std::to_string(x.size(i)) + ", where the package takes sizes of the form " +
            exprs[i] + " (such as " + std::to_string(x.size(i) - r) + " or " + std::to_string(x.size(i) - r + a) + ")");
      }
      values[unknown[0]] = (x.size(i) - b) / a;
      first[unknown[0]] = i;
      continue;
    }
    const std::optional<int64_t> expected = SizeExpr::eval(exprs[i], values);
    if (!expected || *expected == x.size(i)) continue;
    int64_t tie = x.dim();  // the first dim of a symbol that the expression uses
    for (const auto& [symbol, dim] : first) {
      std::map<std::string, int64_t> without = values;
      without.erase(symbol);
      if (!SizeExpr::eval(exprs[i], without)) tie = std::min(tie, dim);
    }
    throw std::runtime_error(
        "model '" + model + "' refused input 0 of shape " + shape_str(x.sizes()) + ": its dim " + std::to_string(i) +
        " is " + std::to_string(x.size(i)) + ", where the package ties it to dim " + std::to_string(tie) + " (" +
        exprs[i] + " at export) and so expects " + std::to_string(*expected));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  try {
#ifndef CUSTOMOPS_SERVE_WITHOUT_OPS
    require_customops_ops();
#endif
    const torch::Device device(args.device);
    if (device.is_cuda() && !torch::cuda::is_available()) {
      throw std::runtime_error("--device " + args.device + ": this machine has no usable CUDA device");
    }
    at::Tensor x;
    try {
      const c10::IValue loaded = torch::pickle_load(read_file(args.input, "input"));
      if (!loaded.isTensor()) throw std::runtime_error("it holds a " + loaded.tagKind() + ", not a tensor");
      x = loaded.toTensor();
    } catch (const c10::Error& e) {
      throw std::runtime_error(
          "input file '" + args.input + "' is not a tensor saved with torch.save: " + e.what_without_backtrace());
    } catch (const std::exception& e) {
      throw std::runtime_error("input file '" + args.input + "' is not a tensor saved with torch.save: " + e.what());
    }
    x = x.to(device);
    if (!std::ifstream(args.model).good()) throw std::runtime_error("model file '" + args.model + "' cannot be opened");

    std::function<at::Tensor(const at::Tensor&)> run;
    std::unique_ptr<torch::inductor::AOTIModelPackageLoader> package;
    torch::jit::Module module;
    try {
      if (ends_with(args.model, ".pt2")) {
        package = std::make_unique<torch::inductor::AOTIModelPackageLoader>(args.model);
        run = [&](const at::Tensor& in) {
          std::vector<at::Tensor> outs = package->run({in});
          if (outs.size() != 1) {
            throw std::runtime_error(
                "the model returns " + std::to_string(outs.size()) +
                " tensors; customops_serve serves models with one tensor output");
          }
          return outs[0];
        };
      } else {
        module = torch::jit::load(args.model, device);
        module.eval();
        run = [&](const at::Tensor& in) {
          const c10::IValue out = module.forward({in});
          if (!out.isTensor()) {
            throw std::runtime_error(
                "the model returns a " + out.tagKind() + "; customops_serve serves models with one tensor output");
          }
          return out.toTensor();
        };
      }
    } catch (const c10::Error& e) {
      throw std::runtime_error("cannot load model '" + args.model + "': " + explain(e.what_without_backtrace()));
    } catch (const std::exception& e) {  // TorchScript's ErrorReport, among others
      throw std::runtime_error("cannot load model '" + args.model + "': " + explain(e.what()));
    }

    c10::InferenceMode inference_mode;
    if (package) {
      // customops.export records a package's inputs in its metadata; a package without the
      // record (made by torch itself) gets x as given, unchecked, as torch's loader does.
      const auto metadata = package->get_metadata();
      const auto recorded = metadata.find("customops_inputs");
      if (recorded != metadata.end()) check_input(recorded->second, x, args.model);
      const auto tied = metadata.find("customops_input_dims");
      if (tied != metadata.end()) check_tied_dims(tied->second, x, args.model);
      x = row_major(x);  // as the export examples were laid out
    }
    auto sync = [&] {
      if (device.is_cuda()) torch::cuda::synchronize();
    };
    at::Tensor out;
    for (int i = 0; i < args.warmup; ++i) out = run(x);
    std::vector<double> ms;
    for (int i = 0; i < args.runs; ++i) {
      sync();
      const auto t0 = std::chrono::steady_clock::now();
      out = run(x);
      sync();
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    const double median = ms[ms.size() / 2];
    const double p99 = ms[std::min(ms.size() - 1, static_cast<size_t>(0.99 * ms.size()))];

    const std::vector<char> bytes = torch::pickle_save(out.cpu());
    std::ofstream output_file(args.output, std::ios::binary);
    output_file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    output_file.close();
    if (!output_file) throw std::runtime_error("output file '" + args.output + "' cannot be written");
    std::printf(
        "model %s, input %s, output %s on %s: median %.4f ms, p99 %.4f ms over %d runs\n", args.model.c_str(),
        shape_str(x.sizes()).c_str(), shape_str(out.sizes()).c_str(), args.device.c_str(), median, p99, args.runs);
    return 0;
  } catch (const c10::Error& e) {
    std::cerr << "customops_serve: error: " << explain(e.what_without_backtrace()) << "\n";
  } catch (const std::exception& e) {
    std::cerr << "customops_serve: error: " << explain(e.what()) << "\n";
  }
  return 1;
}
