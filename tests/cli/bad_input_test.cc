// Bad input to every subcommand gets one line `error: <place>: <what>; <what to do>`, exit 2, and
// leaves nothing half-written: broken models, damaged or foreign checkpoints, outputs that cannot
// be written, malformed .npy inputs and schedule CSVs with absurd numbers. The bad models are
// tests/cli/fixtures/bad_input/*.onnx (make.py there writes them); the rest is written here.
#include <gtest/gtest.h>
#include <sys/mount.h>

#include <cstdint>
#include <sstream>

#include "train/checkpoint.h"
#include "tests/cli/run_cli.h"

namespace {

const std::string kFixtures = "tests/cli/fixtures/bad_input/";

// A few steps of `model` on 2 stages (1f1b), checkpoints every 2 steps in `ckpt`, the trained
// model at `dir`/trained.onnx.
fs::path config(const fs::path& dir, const std::string& model, const fs::path& ckpt, int batch = 4) {
  std::ostringstream c;
  c << "model: " << model << "\n"
    << "dims: {batch: " << batch << "}\n"
    << "data: {kind: synthetic, samples: 64, eval_fraction: 0.25}\n"
    << "optimizer: {kind: adamw, lr: 3.0e-3}\n"
    << "pipeline: {stages: 2, chunks: 1, micro_batches: 2, schedule: 1f1b}\n"
    << "steps: 4\n"
    << "checkpoint: {dir: " << ckpt.string() << ", every: 2}\n"
    << "output: {model: " << (dir / "trained.onnx").string() << "}\n";
  return write(dir / (model.substr(model.rfind('/') + 1) + ".yaml"), c.str());
}

// A .npy file: the magic, a version-1 header padded to 64 bytes, then `data`.
fs::path write_npy(const fs::path& path, const std::string& header, const std::string& data) {
  std::string h = header;
  h += std::string(64 - (10 + h.size() + 1) % 64, ' ') + "\n";
  const uint16_t len = static_cast<uint16_t>(h.size());
  std::ofstream out(path, std::ios::binary);
  out.write("\x93NUMPY\x01\x00", 8);
  out.write(reinterpret_cast<const char*>(&len), 2);
  out << h << data;
  return path;
}

// Group 1: models with a cycle, a node reading its own output, shapes past any memory, an empty
// input and weights that are not finite.
TEST(BadInput, BrokenModelsGetOneLine) {
  expect_one_line_error(run("inspect " + kFixtures + "cycle.onnx"),
                        kFixtures + "cycle.onnx: node 'a' (Add, opset 17): reads 'b_out', which node 'b' (Relu) "
                                    "writes after it (a cycle, or nodes out of order); export the model again; an "
                                    "ONNX graph lists its nodes in topological order");
  expect_one_line_error(run("partition " + kFixtures + "self_loop.onnx --stages 2"),
                        kFixtures + "self_loop.onnx: node 's' (Add, opset 17): reads 's_out', its own output (a "
                                    "cycle, or nodes out of order); export the model again; an ONNX graph lists "
                                    "its nodes in topological order");
  for (const std::string dims : {"4611686018427387904,8", "4611686018427387904,4611686018427387904,8"}) {
    const std::string m = kFixtures + (dims.size() > 30 ? "dim_2p62_squared" : "dim_2p62") + ".onnx";
    expect_one_line_error(run("partition " + m + " --stages 2"),
                          m + ": input 'x': is float32[" + dims + "], more than 2^48 bytes (256 TiB), which no "
                              "machine holds; check the dims the model declares, or bind smaller ones with --dim "
                              "(dims: in the config)");
  }
  // 2^40 rows is 32 TiB: inspect and partition report it as it is.
  const Result big = run("partition " + kFixtures + "dim_2p40.onnx --stages 2");
  EXPECT_EQ(big.code, 0) << big.err;
  EXPECT_NE(big.out.find("32.0 TiB"), std::string::npos) << big.out;
  expect_one_line_error(run("inspect " + kFixtures + "nan_weight.onnx"),
                        kFixtures + "nan_weight.onnx: initializer 'w': holds NaN (element 28 of float32[8,8]); "
                                    "export the model again from finite weights");

  // Training: an empty input stops at the kernel that cannot take it, an inf weight at step 1;
  // neither writes a checkpoint or a model.
  const fs::path d = scratch("bad_models");
  expect_one_line_error(run("train -q " + config(d, kFixtures + "dim_zero.onnx", d / "ckpt").string()),
                        "node 'mm' (MatMul) in graph 'dim_zero_chunk0_fwd': the CPU kernel for MatMul does not "
                        "take inputs (float32[0,8], float32[8,8]) with these attributes; run it on another "
                        "backend or replace the op; `pipetrain ops` lists what the cpu backend takes");
  expect_one_line_error(run("train -q " + config(d, kFixtures + "inf_weight.onnx", d / "ckpt").string()),
                        "step 1: the loss is inf; the first inf: output 'h' of node 'mm' (MatMul) in the forward "
                        "of chunk 0 (stage 0), micro-batch 0; the run stopped before updating the parameters; the "
                        "last checkpoint is kept: lower optimizer.lr, set optimizer.clip_grad_norm, or look at "
                        "that node's inputs");
  EXPECT_FALSE(fs::exists(d / "ckpt"));
  EXPECT_FALSE(fs::exists(d / "trained.onnx"));
}

// Group 2: --resume from a truncated checkpoint, from random bytes, and from another model's.
// An external-data file cut short: import leaves the parameters in the file (each read when a
// device needs it), and still refuses the run at import, from the file's size, in one line
// naming the tensor and the file: nothing trains and nothing is written.
TEST(BadInput, TruncatedExternalDataStopsTrainingAtImport) {
  const fs::path d = scratch("ext_truncated");
  fs::copy_file("samples/synthetic/tiny_ext.onnx", d / "tiny_ext.onnx");
  const std::string data = slurp("samples/synthetic/tiny_ext.onnx.data");
  const size_t kept = data.size() - 100;
  write(d / "tiny_ext.onnx.data", data.substr(0, kept));
  const Result r = run("train -q " + config(d, (d / "tiny_ext.onnx").string(), d / "ckpt", 2).string());
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find((d / "tiny_ext.onnx").string() + ": tensor '"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(" of '" + (d / "tiny_ext.onnx.data").string() + "', which holds " + std::to_string(kept) +
                       "; the external data file is truncated; export the model again"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(d / "ckpt"));
  EXPECT_FALSE(fs::exists(d / "trained.onnx"));
}

TEST(BadInput, ResumeRefusesDamagedAndForeignCheckpoints) {
  const fs::path d = scratch("bad_resume");
  const fs::path mlp = config(d, "samples/mlp/mlp.onnx", d / "ckpt");
  ASSERT_EQ(run("train -q " + mlp.string()).code, 0);
  const fs::path last = d / "ckpt" / "step_00000004.ckpt";
  const std::string good = slurp(last);

  write(last, good.substr(0, good.size() / 2));
  expect_one_line_error(run("train -q " + mlp.string() + " --set steps=6 --resume"),
                        last.string() + ": damaged checkpoint: the file is short; resume from another checkpoint");
  write(last, std::string("\x17\x9c\x02\xfe random bytes, not a checkpoint \x01\x00\x7f", 40));
  expect_one_line_error(run("train -q " + mlp.string() + " --set steps=6 --resume"),
                        last.string() + ": is not a pipetrain checkpoint; point checkpoint.dir at a folder "
                                        "`pipetrain train` wrote");

  write(last, good);
  const fs::path gpt = config(d, "samples/gpt/gpt.onnx", d / "ckpt", 2);
  expect_one_line_error(run("train -q " + gpt.string() + " --set parameters.frozen=[mask] --resume"),
                        gpt.string() + ":7: checkpoint.dir: the checkpoint was written for samples/mlp/mlp.onnx "
                                       "with global batch 8, this run trains samples/gpt/gpt.onnx with 4; resume "
                                       "with the config that wrote it, or choose another checkpoint.dir");
  EXPECT_EQ(slurp(last), good);
  EXPECT_EQ(pt::read_latest_checkpoint((d / "ckpt").string())->step, 4);
}

// Group 3: outputs under a regular file, an output that is a folder, and a full disk.
TEST(BadInput, UnwritableOutputsLeaveNothingHalfWritten) {
  const fs::path d = scratch("bad_outputs");
  const fs::path file = write(d / "file.txt", "not a folder\n");
  const fs::path cfg = config(d, "samples/mlp/mlp.onnx", d / "ckpt");

  expect_one_line_error(run("train -q " + cfg.string() + " --set checkpoint.dir=" + (file / "ckpt").string()),
                        (file / "ckpt").string() + ": cannot create the checkpoint folder: Not a directory; "
                                                   "choose another checkpoint.dir");
  // Found before the first step: no checkpoint, no output.
  expect_one_line_error(
      run("train -q " + cfg.string() + " --set checkpoint.dir=" + (d / "ck1").string() +
          " --set output.model=" + (file / "model.onnx").string()),
      "--set output.model: " + file.string() + " is a file, so " + (file / "model.onnx").string() +
          " cannot be made under it; choose another path");
  EXPECT_FALSE(fs::exists(d / "ck1"));
  fs::create_directories(d / "folder");
  expect_one_line_error(
      run("train -q " + cfg.string() + " --set checkpoint.dir=" + (d / "ck2").string() +
          " --set output.model=" + (d / "folder").string()),
      "--set output.model: " + (d / "folder").string() + " is a folder; name a file in it, e.g. " +
          (d / "folder" / "out").string());
  EXPECT_EQ(temp_files_in(d), 0);
  EXPECT_TRUE(fs::is_empty(d / "folder"));
  EXPECT_EQ(slurp(file), "not a folder\n");

  // A 600 KiB tmpfs holds one checkpoint of the mlp (400 KiB), not two: the second fails, the
  // first stays whole and `latest` names it. Needs root (mount); skipped without.
  const fs::path full = d / "full";
  fs::create_directories(full);
  if (::mount("tmpfs", full.c_str(), "tmpfs", 0, "size=600k") != 0) GTEST_SKIP() << "cannot mount a tmpfs";
  const Result r = run("train -q " + cfg.string() + " --set checkpoint.dir=" + full.string() +
                       " --set output.model=" + (d / "full.onnx").string());
  const std::string latest = slurp(full / "latest");
  const auto steps = pt::checkpoint_steps(full.string());
  const auto kept = pt::read_latest_checkpoint(full.string());
  ::umount(full.c_str());
  expect_one_line_error(r, (full / "step_00000004.ckpt").string() +
                               ": writing failed (disk full?); check the free space and permissions of checkpoint.dir");
  EXPECT_EQ(latest, "step_00000002.ckpt\n");
  EXPECT_EQ(steps, (std::vector<int64_t>{2}));
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ(kept->step, 2);
  EXPECT_FALSE(fs::exists(d / "full.onnx"));
}

// Group 4: .npy inputs of a byte order, layout or dtype pipetrain does not read, with shapes that
// overflow or are negative, and cut short. `run` writes no output for any of them.
TEST(BadInput, NpyInputsGetOneLine) {
  const fs::path d = scratch("bad_npy");
  const std::string floats(64 * 4, '\0');
  auto run_on = [&](const fs::path& npy) {
    return run("run samples/mlp/mlp.onnx -i input=" + npy.string() + " -o " + (d / "out").string());
  };
  auto npy = [&](const std::string& name, const std::string& header, const std::string& data) {
    return write_npy(d / name, header, data);
  };
  const fs::path be = npy("be.npy", "{'descr': '>f4', 'fortran_order': False, 'shape': (1, 64), }", floats);
  expect_one_line_error(run_on(be), be.string() + ": has dtype '>f4', which pipetrain does not read; convert it "
                                                  "to float32, int64, int32 or bool");
  const fs::path fortran = npy("f.npy", "{'descr': '<f4', 'fortran_order': True, 'shape': (1, 64), }", floats);
  expect_one_line_error(run_on(fortran), fortran.string() + ": is in Fortran order; save numpy.ascontiguousarray(x)");
  const fs::path object = npy("o.npy", "{'descr': '|O', 'fortran_order': False, 'shape': (3,), }", "pickled");
  expect_one_line_error(run_on(object), object.string() + ": has dtype '|O', which pipetrain does not read; "
                                                          "convert it to float32, int64, int32 or bool");
  for (const std::string shape : {"4611686018427387904, 4611686018427387904", "4611686018427387904, 64"}) {
    const fs::path huge = npy("huge.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (" + shape + "), }",
                              floats);
    std::string brackets = shape;
    brackets.erase(std::remove(brackets.begin(), brackets.end(), ' '), brackets.end());
    expect_one_line_error(run_on(huge), huge.string() + ": holds 256 bytes of data, fewer than its shape [" +
                                            brackets + "] needs; the file is truncated or its header is wrong; "
                                                       "save it again");
  }
  const fs::path digits =
      npy("d.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999999, 64), }", floats);
  expect_one_line_error(run_on(digits), digits.string() + ": has shape entry '99999999999999999999999', not a size "
                                                          "from 0 to 2^63; save it again with numpy.save");
  const fs::path negative = npy("n.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (-1, 64), }", floats);
  expect_one_line_error(run_on(negative),
                        negative.string() + ": has shape entry '-1', not a size from 0 to 2^63; save it again with "
                                            "numpy.save");
  // A long suffix with no digits (found by fuzz_npy: the parser read before the entry).
  const fs::path suffix = npy("l.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (L, 64), }", floats);
  expect_one_line_error(run_on(suffix),
                        suffix.string() + ": has shape entry 'L', not a size from 0 to 2^63; save it again with "
                                          "numpy.save");
  const fs::path cut = npy("cut.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 64), }",
                           floats.substr(0, 100));
  expect_one_line_error(run_on(cut), cut.string() + ": holds 100 bytes of data, fewer than its shape [1,64] "
                                                    "needs; the file is truncated or its header is wrong; save it "
                                                    "again");
  const fs::path header_cut = write(d / "h.npy", std::string("\x93NUMPY\x01\x00\x76\x00{'descr'", 18));
  expect_one_line_error(run_on(header_cut), header_cut.string() + ": has a truncated header; save it again");
  EXPECT_FALSE(fs::exists(d / "out" / "output.npy"));
}

// Group 5: schedule CSVs whose numbers are absurd: refused in one line, not a hang or an abort,
// by `schedule --from-csv` and by `train` alike.
TEST(BadInput, ScheduleCsvWithAbsurdNumbersGetsOneLine) {
  const fs::path d = scratch("bad_csv");
  const std::string rows = "0F0,0F1,0BW0,0BW1\n1F0,1BW0,1F1,1BW1\n";
  auto check = [&](const std::string& name, const std::string& text, const std::string& what) {
    SCOPED_TRACE(name);
    const fs::path csv = write(d / name, text);
    expect_one_line_error(run("schedule --from-csv " + csv.string()), csv.string() + what);
  };
  check("mb.csv", "0F0,0F1099511627776,0BW0,0BW1\n1F0,1BW0,1F1,1BW1\n",
        ":1: cell 2 ('0F1099511627776') is not an action; write actions like 0F3, 1B2, 1W2, 0BW3, 1SF4, 1RB4 or "
        "STEP");
  check("neg.csv", rows + "-1F0\n",
        ":3: cell 1 ('-1F0') is not an action; write actions like 0F3, 1B2, 1W2, 0BW3, 1SF4, 1RB4 or STEP");
  check("header_mbs.csv", "# micro_batches: 2147483647\n" + rows,
        ": asks for 2 stages x 1 chunks and 2147483647 micro-batches, but holds only 8 actions; check the "
        "header's chunks and micro_batches and the numbers in the actions");
  check("header_chunks.csv", "# chunks: 2147483647\n" + rows,
        ": asks for 2 stages x 2147483647 chunks and 2 micro-batches, but holds only 8 actions; check the "
        "header's chunks and micro_batches and the numbers in the actions");
  check("max_mb.csv", "0F0,0F2147483647,0BW0,0BW1\n1F0,1BW0,1F1,1BW1\n",
        ": asks for 2 stages x 1 chunks and 2147483648 micro-batches, but holds only 8 actions; check the "
        "header's chunks and micro_batches and the numbers in the actions");
  check("max_stage.csv", rows + "2147483647F0\n",
        ": asks for 3 stages x 715827883 chunks and 2 micro-batches, but holds only 9 actions; check the "
        "header's chunks and micro_batches and the numbers in the actions");

  const fs::path cfg = config(d, "samples/mlp/mlp.onnx", d / "ckpt");
  const fs::path csv = d / "header_mbs.csv";
  expect_one_line_error(run("train -q " + cfg.string() + " --set pipeline.schedule=" + csv.string()),
                        "--set pipeline.schedule: " + csv.string() +
                            ": asks for 2 stages x 1 chunks and 2147483647 micro-batches, but holds only 8 actions; "
                            "check the header's chunks and micro_batches and the numbers in the actions");
  EXPECT_FALSE(fs::exists(d / "ckpt"));
  EXPECT_FALSE(fs::exists(d / "trained.onnx"));
}

}  // namespace
