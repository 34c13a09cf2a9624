#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "examples/trainer/trainer.h"

namespace trainer {

const char* usage() {
  return "usage: tutti-train [options]      (under tutti-run -n N, torchrun, srun or mpirun;\n"
         "                                   alone it runs one rank, or --threads N ranks)\n"
         "  (a value follows its option, or is joined to it: --epochs 5, --epochs=5)\n"
         "  --epochs N           passes over the training set (3; each drops the last partial\n"
         "                       global batch, a different one each epoch by the reshuffle)\n"
         "  --batch N            global batch size, over all ranks and accumulation steps (128)\n"
         "  --accum K            gradient accumulation steps per optimizer step (1)\n"
         "  --lr X               learning rate (0.05)\n"
         "  --momentum X         SGD momentum (0.9)\n"
         "  --weight-decay X     L2 weight decay (0.0005)\n"
         "  --grad-dtype T       all-reduce gradients as fp32 or bf16 (fp32)\n"
         "  --hidden A,B,...     hidden layer widths (256,128)\n"
         "  --device cpu|cuda    where the ranks compute (cpu)\n"
         "  --seed N             seed for initialisation and shuffling (1)\n"
         "  --checkpoint PATH    rank 0 saves here after every epoch and at the end\n"
         "  --save-every N       ... and every N optimizer steps\n"
         "  --resume PATH        continue from a checkpoint (step and optimizer state)\n"
         "  --auto-resume        continue from --checkpoint's file where it exists, else\n"
         "                       start afresh (for jobs restarted whole: torchrun\n"
         "                       --max_restarts, a requeued Slurm job)\n"
         "  --max-steps N        stop after N optimizer steps in all\n"
         "  --train-limit N      use only the first N training samples\n"
         "  --test-limit N       use only the first N test samples\n"
         "  --bucket-kb N        gradient bucket size in KiB (256)\n"
         "  --overlap on|off|auto  all-reduce gradient buckets during backward on a\n"
         "                       communication thread (on), or after it (off); auto: on when\n"
         "                       this machine has 2 cores per local rank, and always\n"
         "                       with --device cuda (a stream, not a thread) (auto)\n"
         "  --no-overlap         the same as --overlap off\n"
         "  --threads N          run N ranks as threads of this process\n"
         "  --data DIR           IDX files (/usr/share/datasets/fashion-mnist)\n";
}

namespace {

bool parseInt(const char* s, int64_t lo, int64_t hi, int64_t* v) {
  errno = 0;
  char* end = nullptr;
  long long x = strtoll(s, &end, 10);
  if (errno || end == s || *end || x < lo || x > hi) return false;
  *v = x;
  return true;
}

// The options that take a value (parseOptions' list), so that an unknown one is named as such
// even at the end of the line.
bool isOption(const std::string& a) {
  for (const char* o :
       {"--epochs",       "--batch",      "--accum",      "--lr",      "--momentum",
        "--weight-decay", "--grad-dtype", "--hidden",     "--overlap", "--device",
        "--seed",         "--checkpoint", "--save-every", "--resume",  "--max-steps",
        "--train-limit",  "--test-limit", "--bucket-kb",  "--threads", "--data"}) {
    if (a == o) return true;
  }
  return false;
}

bool parseReal(const char* s, double lo, double hi, double* v) {
  errno = 0;
  char* end = nullptr;
  double x = strtod(s, &end);
  if (errno || end == s || *end || !(x >= lo && x <= hi)) return false;
  *v = x;
  return true;
}

}  // namespace

int parseOptions(int argc, char** argv, Options* o, std::string* error) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") return 1;
    if (a == "--no-overlap") {
      o->overlap = o->overlap_auto = false;
      continue;
    }
    if (a == "--auto-resume") {
      o->auto_resume = true;
      continue;
    }
    if (a.rfind("--", 0) != 0) {
      *error = "unexpected argument '" + a + "'";
      return -1;
    }
    // --name=value as well as --name value (argparse and torchrun users write both).
    std::string inline_value;
    const size_t eq = a.find('=');
    const bool has_inline = eq != std::string::npos;
    if (has_inline) {
      inline_value = a.substr(eq + 1);
      a.resize(eq);
    }
    if (!isOption(a)) {
      *error = "unknown option " + a + " (see --help)";
      return -1;
    }
    if (!has_inline && i + 1 >= argc) {
      *error = a + " needs a value";
      return -1;
    }
    if (has_inline && inline_value.empty()) {  // --resume=$UNSET must not mean "no resume"
      *error = a + "= has no value";
      return -1;
    }
    const char* v = has_inline ? inline_value.c_str() : argv[++i];
    int64_t n = 0;
    double x = 0;
    auto bad = [&](const char* what) {
      *error = a + " " + v + ": expected " + what;
      return -1;
    };
    if (a == "--epochs") {
      if (!parseInt(v, 1, 100000, &n)) return bad("an integer from 1");
      o->epochs = int(n);
    } else if (a == "--batch") {
      if (!parseInt(v, 1, 1 << 24, &n)) return bad("an integer from 1");
      o->batch = int(n);
    } else if (a == "--accum") {
      if (!parseInt(v, 1, 1 << 20, &n)) return bad("an integer from 1");
      o->accum = int(n);
    } else if (a == "--lr") {
      if (!parseReal(v, 0, 1e6, &x)) return bad("a number >= 0");
      o->lr = x;
    } else if (a == "--momentum") {
      if (!parseReal(v, 0, 1, &x)) return bad("a number in [0, 1]");
      o->momentum = x;
    } else if (a == "--weight-decay") {
      if (!parseReal(v, 0, 1e6, &x)) return bad("a number >= 0");
      o->weight_decay = x;
    } else if (a == "--grad-dtype") {
      if (!strcmp(v, "fp32") || !strcmp(v, "float32") || !strcmp(v, "float")) {
        o->grad_dtype = ncclFloat32;
      } else if (!strcmp(v, "bf16") || !strcmp(v, "bfloat16")) {
        o->grad_dtype = ncclBfloat16;
      } else {
        return bad("fp32 or bf16");
      }
    } else if (a == "--hidden") {
      o->hidden.clear();
      std::string s = v;
      size_t pos = 0;
      while (pos <= s.size()) {
        size_t comma = s.find(',', pos);
        std::string part =
            s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
        if (!parseInt(part.c_str(), 1, 1 << 16, &n)) {
          return bad("a comma-separated list of widths from 1, e.g. 256,128");
        }
        o->hidden.push_back(int(n));
        if (comma == std::string::npos) break;
        pos = comma + 1;
      }
    } else if (a == "--overlap") {
      if (strcmp(v, "on") && strcmp(v, "off") && strcmp(v, "auto")) return bad("on, off or auto");
      o->overlap_auto = !strcmp(v, "auto");
      o->overlap = strcmp(v, "off") != 0;
    } else if (a == "--device") {
      if (strcmp(v, "cpu") && strcmp(v, "cuda")) return bad("cpu or cuda");
      o->device = v;
    } else if (a == "--seed") {
      if (!parseInt(v, 0, INT64_MAX, &n)) return bad("an integer >= 0");
      o->seed = uint64_t(n);
    } else if (a == "--checkpoint") {
      o->checkpoint = v;
    } else if (a == "--save-every") {
      if (!parseInt(v, 0, INT64_MAX, &n)) return bad("an integer >= 0");
      o->save_every = n;
    } else if (a == "--resume") {
      o->resume = v;
    } else if (a == "--max-steps") {
      if (!parseInt(v, 0, INT64_MAX, &n)) return bad("an integer >= 0");
      o->max_steps = n;
    } else if (a == "--train-limit") {
      if (!parseInt(v, 0, 1 << 24, &n)) return bad("an integer >= 0");
      o->train_limit = int(n);
    } else if (a == "--test-limit") {
      if (!parseInt(v, 0, 1 << 24, &n)) return bad("an integer >= 0");
      o->test_limit = int(n);
    } else if (a == "--bucket-kb") {
      if (!parseInt(v, 1, 1 << 22, &n)) return bad("an integer from 1");
      o->bucket_bytes = size_t(n) * 1024;
    } else if (a == "--threads") {
      if (!parseInt(v, 1, 1024, &n)) return bad("an integer from 1 to 1024");
      o->threads = int(n);
    } else if (a == "--data") {
      o->data_dir = v;
    } else {
      *error = "unknown option " + a + " (see --help)";
      return -1;
    }
  }
  if (o->save_every > 0 && o->checkpoint.empty()) {
    *error = "--save-every needs --checkpoint PATH (where to save)";
    return -1;
  }
  if (o->auto_resume && o->checkpoint.empty()) {
    *error = "--auto-resume needs --checkpoint PATH (where to save, and to resume from)";
    return -1;
  }
  if (o->auto_resume && !o->resume.empty()) {
    *error = "--auto-resume and --resume " + o->resume +
             " both say where to resume from: give one (--auto-resume takes --checkpoint's file)";
    return -1;
  }
  return 0;
}

}  // namespace trainer
