// `leantrain report`: a real short run rendered to PNG plots and index.html (each PNG decoded
// with libpng and checked to hold a picture, not one flat colour), hand-written metrics for
// the edge cases (null numbers, a truncated last line, absent data), bench mode, and the
// bad inputs that must exit 2 without leaving a half-written report.
#include <png.h>

#include <cstdlib>

#include "cli_fixture.h"

namespace {

struct Png {
  bool ok = false;
  std::string error;
  unsigned width = 0, height = 0;
  bool single_colour = true;
};

// Decodes `path` to RGBA with libpng's simplified API.
Png decode_png(const fs::path& path) {
  Png out;
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_file(&image, path.c_str())) {
    out.error = image.message;
    return out;
  }
  image.format = PNG_FORMAT_RGBA;
  std::vector<png_byte> pixels(PNG_IMAGE_SIZE(image));
  if (!png_image_finish_read(&image, nullptr, pixels.data(), 0, nullptr)) {
    out.error = image.message;
    png_image_free(&image);
    return out;
  }
  out.ok = true;
  out.width = image.width;
  out.height = image.height;
  for (size_t i = 4; i + 4 <= pixels.size() && out.single_colour; i += 4)
    out.single_colour = std::equal(pixels.begin(), pixels.begin() + 4, pixels.begin() + i);
  return out;
}

void expect_picture(const fs::path& png, unsigned width, unsigned height) {
  ASSERT_TRUE(fs::exists(png)) << png;
  EXPECT_GT(fs::file_size(png), 0u) << png;
  const Png p = decode_png(png);
  ASSERT_TRUE(p.ok) << png << ": " << p.error;
  EXPECT_EQ(p.width, width) << png;
  EXPECT_EQ(p.height, height) << png;
  EXPECT_FALSE(p.single_colour) << png << " is one flat colour";
}

bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

// Names in `dir` that start with `prefix` (leftover staging folders).
std::vector<std::string> names_starting(const fs::path& dir, const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind(prefix, 0) == 0) out.push_back(e.path().filename());
  return out;
}

}  // namespace

class Report : public Cli {
 protected:
  // Hand-written metrics: 4 steps (loss null at step 3), no epoch, loss scale 1 throughout.
  fs::path hand_run(const std::string& tail = "") {
    const auto run = dir_ / "hand";
    fs::create_directories(run);
    std::ofstream(run / "metrics.jsonl")
        << R"({"event":"step","step":1,"loss":2.5,"loss_scale":1.0,"samples_per_s":100,"peak_mem_bytes":3000000,)"
           R"("mem_params_bytes":1000000,"mem_grads_bytes":1000000,"mem_optimizer_bytes":0,"mem_activations_bytes":1000000})"
        << "\n"
        << R"({"event":"step","step":2,"loss":2.0,"loss_scale":1.0,"samples_per_s":200,"peak_mem_bytes":5000000,)"
           R"("mem_params_bytes":1000000,"mem_grads_bytes":1000000,"mem_optimizer_bytes":2000000,"mem_activations_bytes":1000000})"
        << "\n"
        << R"({"event":"step","step":3,"loss":null,"loss_scale":1.0,"samples_per_s":210,"peak_mem_bytes":5000000})" << "\n"
        << R"({"event":"step","step":4,"loss":1.25,"loss_scale":1.0,"samples_per_s":190,"peak_mem_bytes":5000000})" << "\n"
        << tail;
    return run;
  }
};

// The issue's acceptance test: a short run (fp16, with an out-of-memory back-off, a skipped
// step, checkpoints and two evaluations) rendered into five readable plots and one page.
TEST_F(Report, RendersEveryPlotOfAShortRun) {
  const auto run_dir = dir_ / "run";
  const std::string train =
      "train --config " + demo() +
      " --set model.kind=mlp --set model.hidden=[64] --set train.steps=20 --set data.limit=1280" +
      " --set train.eval_max_batches=2 --set checkpoint.every_steps=10 --set log.progress=none --out " +
      run_dir.string();
  auto t = run_cmd("LEANTRAIN_FAULT=oom@3,nan@6 " + std::string(LEANTRAIN_BINARY) + " " + train +
                   " --set precision.mode=fp16");
  bool fp16 = true;
  if (t.code == 2 && contains(t.err, "precision.mode = 'fp16'")) {  // a LibTorch without CPU fp16
    fp16 = false;
    fs::remove_all(run_dir);
    t = run_cmd("LEANTRAIN_FAULT=oom@3 " + std::string(LEANTRAIN_BINARY) + " " + train);
  }
  ASSERT_EQ(t.code, 0) << t.err;
  const auto at = t.err.find("final loss ");
  ASSERT_NE(at, std::string::npos) << t.err;
  const std::string final_loss = t.err.substr(at + 11, t.err.find(',', at) - at - 11);

  auto r = run("report " + run_dir.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, (run_dir / "report" / "index.html").string())) << r.err;
  std::vector<std::string> pngs = {"loss.png", "samples_per_s.png", "peak_memory.png", "eval.png"};
  if (fp16) pngs.push_back("loss_scale.png");
  for (const auto& p : pngs) expect_picture(run_dir / "report" / p, 900, 400);

  const std::string html = slurp(run_dir / "report" / "index.html");
  EXPECT_TRUE(contains(html, "<tr><th>final loss</th><td>" + final_loss + "</td></tr>")) << final_loss << "\n" << html;
  for (const auto& p : pngs) EXPECT_TRUE(contains(html, "<img src=\"" + p + "\"")) << p;
  EXPECT_TRUE(contains(html, "mlp (hidden [64])"));
  EXPECT_TRUE(contains(html, "world size</th><td>1 "));
  EXPECT_TRUE(contains(html, "step 3 micro-batch 64 × 2 → 32 × 4")) << html;  // the back-off
  EXPECT_TRUE(contains(html, "<tr><th>checkpoints written</th><td>2, "));
  if (fp16) EXPECT_TRUE(contains(html, "step 6 non-finite gradient"));
  EXPECT_TRUE(contains(html, "<tr><td>2</td><td>20</td>")) << "epoch 2 row";
  EXPECT_FALSE(contains(html, "http://") || contains(html, "https://")) << "no external resources";
  EXPECT_TRUE(names_starting(run_dir, "report.").empty());

  // Rerunning replaces the report as a whole.
  std::ofstream(run_dir / "report" / "stale.txt") << "x";
  ASSERT_EQ(run("report " + run_dir.string()).code, 0);
  EXPECT_FALSE(fs::exists(run_dir / "report" / "stale.txt"));
  EXPECT_TRUE(fs::exists(run_dir / "report" / "loss.png"));
  EXPECT_TRUE(names_starting(run_dir, "report.").empty());
}

// Absent data is said, not drawn empty; null numbers are skipped; a truncated last line
// (a killed run) is a warning; --out puts the report elsewhere.
TEST_F(Report, OmitsAbsentPlotsAndSkipsTruncatedLastLine) {
  const auto run_dir = hand_run(R"({"event":"step","step":5,"lo)");
  const auto out = dir_ / "elsewhere" / "rep";
  auto r = run("report " + run_dir.string() + " --out " + out.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "metrics.jsonl:5: skipped a truncated last line")) << r.err;
  for (const char* p : {"loss.png", "samples_per_s.png", "peak_memory.png"}) expect_picture(out / p, 900, 400);
  EXPECT_FALSE(fs::exists(out / "loss_scale.png"));
  EXPECT_FALSE(fs::exists(out / "eval.png"));
  // The null loss of step 3 is not a point.
  EXPECT_EQ(slurp(out / "gnuplot" / "loss.dat"), "1 2.5\n2 2\n4 1.25\n");
  const std::string html = slurp(out / "index.html");
  EXPECT_TRUE(contains(html, "loss_scale.png is not drawn: the loss scale is 1 at every step")) << html;
  EXPECT_TRUE(contains(html, "eval.png is not drawn: no epoch events")) << html;
  EXPECT_FALSE(contains(html, "<img src=\"eval.png\""));
  EXPECT_TRUE(contains(html, "<tr><th>final loss</th><td>1.250000</td></tr>")) << html;
  EXPECT_TRUE(contains(html, "<tr><th>mean samples/s</th><td>200 (without the first step)")) << html;
  EXPECT_TRUE(contains(html, "<tr><th>peak memory</th><td>4.77 MiB at step 2 (parameters 976.56 KiB")) << html;
  EXPECT_TRUE(contains(html, "config.json not found"));
  EXPECT_TRUE(contains(r.err, "not drawn: eval.png: no epoch events")) << r.err;
  EXPECT_FALSE(fs::exists(run_dir / "report"));
}

TEST_F(Report, MissingRunOrMetricsExitsTwo) {
  expect_config_error("report " + (dir_ / "nope").string(), (dir_ / "nope").string() + ": no such run folder");
  fs::create_directories(dir_ / "empty");
  expect_config_error("report " + (dir_ / "empty").string(), "empty/metrics.jsonl: no such file");
  expect_config_error("report", "report takes a run folder");
  EXPECT_FALSE(fs::exists(dir_ / "empty" / "report"));
}

TEST_F(Report, MalformedLineExitsTwoNamingItsNumber) {
  const auto run_dir = hand_run("{\"event\":\"step\",\"step\":5,\"loss\":}\n{\"event\":\"step\",\"step\":6}\n");
  expect_config_error("report " + run_dir.string(), "metrics.jsonl:5: malformed JSON");
  EXPECT_FALSE(fs::exists(run_dir / "report"));
  EXPECT_TRUE(names_starting(run_dir, "report.").empty()) << "a staging folder was left behind";
  // A number field holding something else names the key.
  std::ofstream(run_dir / "metrics.jsonl") << R"({"event":"step","step":1,"loss":"low"})" << "\n";
  expect_config_error("report " + run_dir.string(), "metrics.jsonl:1: \"loss\" must be a number or null");
  std::ofstream(run_dir / "metrics.jsonl") << R"({"step":1})" << "\n";
  expect_config_error("report " + run_dir.string(), "metrics.jsonl:1: no \"event\" string");
}

TEST_F(Report, MissingGnuplotExitsTwoNamingThePackage) {
  const auto run_dir = hand_run();
  auto r = run_cmd("LEANTRAIN_GNUPLOT=/nonexistent/gnuplot " + std::string(LEANTRAIN_BINARY) + " report " +
                   run_dir.string());
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "gnuplot-nox")) << r.err;
  EXPECT_FALSE(fs::exists(run_dir / "report"));
  EXPECT_TRUE(names_starting(run_dir, "report.").empty());
  // A gnuplot that fails is a runtime failure (exit 1), and no report appears either.
  r = run_cmd("LEANTRAIN_GNUPLOT=/bin/false " + std::string(LEANTRAIN_BINARY) + " report " + run_dir.string());
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "/bin/false failed (exit status 1)")) << r.err;
  EXPECT_FALSE(fs::exists(run_dir / "report"));
  EXPECT_TRUE(names_starting(run_dir, "report.").empty());
}

TEST_F(Report, BenchModeDrawsOneChartPerMetric) {
  const auto bench = dir_ / "bench.jsonl";
  std::ofstream(bench)
      << R"({"bench":"gpt6 fp32","row":"1 rank","metric":"samples_per_s","value":120,"baseline":100})" << "\n"
      << R"({"bench":"gpt6 fp32","row":"2 ranks","metric":"samples_per_s","value":90,"baseline":100})" << "\n"
      << R"({"bench":"resnet50 bf16","row":"1 rank","metric":"samples_per_s","value":50,"baseline":40})" << "\n"
      << R"({"bench":"allreduce","row":"16 MiB","metric":"busbw GB/s","value":3.5})" << "\n"
      << R"({"bench":"allreduce","row":"<b>64 MiB</b>","metric":"busbw GB/s","value":null})" << "\n";
  const auto out = dir_ / "bench_report";
  auto r = run("report --bench " + bench.string() + " --out " + out.string());
  ASSERT_EQ(r.code, 0) << r.err;
  // 3 bars: max(260, 110 + 26 * 3) = 260 pixels high; 2 bars likewise.
  expect_picture(out / "samples_per_s.png", 900, 260);
  expect_picture(out / "busbw_GB_s.png", 900, 260);
  const std::string html = slurp(out / "index.html");
  EXPECT_TRUE(contains(html, "<img src=\"samples_per_s.png\""));
  EXPECT_TRUE(contains(html, "<img src=\"busbw_GB_s.png\""));
  EXPECT_TRUE(contains(html, "<td>gpt6 fp32</td><td>1 rank</td><td>samples_per_s</td><td>120</td><td>100</td><td>1.2</td>"))
      << html;
  EXPECT_TRUE(contains(html, "&lt;b&gt;64 MiB&lt;/b&gt;")) << "escaped";
  // The ratio chart marks 1.0; the chart without baselines shows raw values.
  const std::string gp = slurp(out / "gnuplot" / "plots.gp");
  EXPECT_TRUE(contains(gp, "set arrow from 1, graph 0")) << gp;
  EXPECT_TRUE(contains(gp, "samples_per_s: value / baseline"));
  EXPECT_TRUE(contains(gp, "set title 'busbw GB/s'")) << gp;
  EXPECT_TRUE(names_starting(dir_, "bench_report.").empty());
}

TEST_F(Report, BadBenchFileExitsTwo) {
  const auto bench = dir_ / "bench.jsonl";
  std::ofstream(bench) << R"({"bench":"a","row":"r","metric":"m","value":1})" << "\n"
                       << R"({"bench":"a","row":"r","value":1})" << "\n";
  expect_config_error("report --bench " + bench.string() + " --out " + (dir_ / "o").string(),
                      "bench.jsonl:2: missing \"metric\"");
  std::ofstream(bench) << "not json\n";
  expect_config_error("report --bench " + bench.string() + " --out " + (dir_ / "o").string(),
                      "bench.jsonl:1: malformed JSON");
  expect_config_error("report --bench " + bench.string(), "report --bench needs --out DIR");
  expect_config_error("report --bench " + (dir_ / "none.jsonl").string() + " --out " + (dir_ / "o").string(),
                      "none.jsonl: no such file");
  EXPECT_FALSE(fs::exists(dir_ / "o"));
}

// A report replaces its whole folder, so --out naming a folder that holds other files (the
// bench's own results, say) is refused and those files stay; an earlier report, or an empty
// folder, is replaced.
TEST_F(Report, RefusesAnOutFolderHoldingOtherFiles) {
  const auto results = dir_ / "results";
  fs::create_directories(results);
  const auto bench = results / "results.jsonl";
  const std::string line = R"({"bench":"a","row":"r","metric":"m","value":1})";
  std::ofstream(bench) << line << "\n";
  expect_config_error("report --bench " + bench.string() + " --out " + results.string(),
                      "holds files that are not a leantrain report");
  EXPECT_EQ(slurp(bench), line + "\n");
  EXPECT_EQ(std::distance(fs::directory_iterator(results), fs::directory_iterator{}), 1);
  EXPECT_TRUE(names_starting(dir_, "results.").empty());

  const auto empty = dir_ / "empty";
  fs::create_directories(empty);
  ASSERT_EQ(run("report --bench " + bench.string() + " --out " + empty.string()).code, 0);
  EXPECT_TRUE(fs::exists(empty / ".leantrain-report"));
  ASSERT_EQ(run("report --bench " + bench.string() + " --out " + empty.string()).code, 0) << "a report is replaced";
  expect_picture(empty / "m.png", 900, 260);
}
