// Run an mrcnn AOTInductor package on one image, from C++ with no Python.
//
//   mrcnn_aoti_example PACKAGE.aoti.pt2 IMAGE.ppm [--repeat N] [--threads N]
//
// PACKAGE comes from `mrcnn export --format aoti`; its metadata (mrcnn.* keys) gives the canvas,
// the batch size and the transform settings. IMAGE is a binary PPM (P6, maxval 255), so no image
// library is needed. The host-side transform is the Python one (mrcnn/transform.py), op for op:
// uint8 -> float / 255, normalise, bilinear resize (align_corners=False, size = floor(side *
// scale)), zero-pad to the canvas. Detections are printed in original-image pixels, like
// mrcnn.postprocess (masks are not pasted here).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

struct Usage : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// [3, H, W] uint8 from a binary PPM (P6, maxval 255); '#' comments allowed in the header.
at::Tensor read_ppm(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open image " + path);
  std::vector<std::string> fields;
  while (fields.size() < 4) {
    int c = in.peek();
    if (c == EOF) throw std::runtime_error(path + ": truncated PPM header");
    if (std::isspace(c)) {
      in.get();
    } else if (c == '#') {
      std::string comment;
      std::getline(in, comment);
    } else {
      std::string token;
      in >> token;
      fields.push_back(token);
    }
  }
  in.get();  // the single whitespace byte before the pixels
  if (fields[0] != "P6" || fields[3] != "255") {
    throw std::runtime_error(path + ": expected a binary PPM (P6) with maxval 255, got " + fields[0] +
                             " with maxval " + fields[3]);
  }
  const int64_t width = std::stoll(fields[1]), height = std::stoll(fields[2]);
  if (width <= 0 || height <= 0) throw std::runtime_error(path + ": empty image");
  std::vector<uint8_t> pixels(static_cast<size_t>(width * height * 3));
  in.read(reinterpret_cast<char*>(pixels.data()), static_cast<std::streamsize>(pixels.size()));
  if (in.gcount() != static_cast<std::streamsize>(pixels.size())) {
    throw std::runtime_error(path + ": truncated PPM (" + std::to_string(in.gcount()) + " of " +
                             std::to_string(pixels.size()) + " pixel bytes)");
  }
  return at::from_blob(pixels.data(), {height, width, 3}, at::kByte).permute({2, 0, 1}).contiguous();
}

std::string need(const std::unordered_map<std::string, std::string>& meta, const std::string& key) {
  auto it = meta.find(key);
  if (it == meta.end()) {
    throw std::runtime_error("package metadata has no " + key +
                             ": was it built by `mrcnn export --format aoti`?");
  }
  return it->second;
}

std::vector<float> floats(const std::string& csv) {
  std::vector<float> out;
  std::stringstream ss(csv);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(static_cast<float>(std::stod(item)));
  return out;
}

double median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  size_t n = xs.size();
  return n % 2 ? xs[n / 2] : 0.5 * (xs[n / 2 - 1] + xs[n / 2]);
}

int run(int argc, char** argv) {
  std::vector<std::string> positional;
  int repeat = 1, threads = 0;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if ((arg == "--repeat" || arg == "--threads") && i + 1 < argc) {
      (arg == "--repeat" ? repeat : threads) = std::stoi(argv[++i]);
    } else if (arg.rfind("--", 0) == 0) {
      throw Usage("unknown option " + arg);
    } else {
      positional.push_back(arg);
    }
  }
  if (positional.size() != 2 || repeat < 1) throw Usage("expected PACKAGE.pt2 and IMAGE.ppm");
  if (threads > 0) at::set_num_threads(threads);
  const std::string package_path = positional[0], image_path = positional[1];

  auto t_load = std::chrono::steady_clock::now();
  torch::inductor::AOTIModelPackageLoader loader(package_path);
  auto meta = loader.get_metadata();
  const int64_t canvas_h = std::stoll(need(meta, "mrcnn.canvas_height"));
  const int64_t canvas_w = std::stoll(need(meta, "mrcnn.canvas_width"));
  const int64_t batch = std::stoll(need(meta, "mrcnn.batch_size"));
  const double min_size = std::stod(need(meta, "mrcnn.min_size"));
  const double max_size = std::stod(need(meta, "mrcnn.max_size"));
  const std::vector<float> mean = floats(need(meta, "mrcnn.image_mean"));
  const std::vector<float> stdev = floats(need(meta, "mrcnn.image_std"));
  const double load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_load).count();
  std::printf("package %s: preset %s, canvas %lldx%lld (HxW), batch size %lld (loaded in %.0f ms)\n",
              package_path.c_str(), need(meta, "mrcnn.preset").c_str(), static_cast<long long>(canvas_h),
              static_cast<long long>(canvas_w), static_cast<long long>(batch), load_ms);

  // Transform, as mrcnn.transform.to_image_batch does it.
  at::Tensor image = read_ppm(image_path);
  const int64_t h = image.size(1), w = image.size(2);
  at::Tensor x = image.to(at::kFloat).div_(255.0);
  x = (x - at::tensor(mean).view({3, 1, 1})) / at::tensor(stdev).view({3, 1, 1});
  const double scale = std::min(min_size / static_cast<double>(std::min(h, w)),
                                max_size / static_cast<double>(std::max(h, w)));
  const auto rh = static_cast<int64_t>(std::floor(static_cast<double>(h) * scale));
  const auto rw = static_cast<int64_t>(std::floor(static_cast<double>(w) * scale));
  if (rh > canvas_h || rw > canvas_w) {
    std::fprintf(stderr,
                 "error: image %s (%lldx%lld, HxW) resizes to %lldx%lld, which does not fit this package's "
                 "canvas %lldx%lld; export a package for a larger canvas (mrcnn export --canvas HxW)\n",
                 image_path.c_str(), static_cast<long long>(h), static_cast<long long>(w),
                 static_cast<long long>(rh), static_cast<long long>(rw), static_cast<long long>(canvas_h),
                 static_cast<long long>(canvas_w));
    return 2;
  }
  at::Tensor resized = at::upsample_bilinear2d(x.unsqueeze(0), {rh, rw}, /*align_corners=*/false);
  // Slot 0 holds the image; other slots pad the static batch (their detections are ignored).
  at::Tensor images = at::zeros({batch, 3, canvas_h, canvas_w}, at::kFloat);
  images[0].narrow(1, 0, rh).narrow(2, 0, rw).copy_(resized[0]);
  at::Tensor image_sizes = at::tensor(std::vector<int64_t>{canvas_h, canvas_w}, at::kLong).repeat({batch, 1});
  image_sizes[0][0] = rh;
  image_sizes[0][1] = rw;
  std::printf("image %s: %lldx%lld (HxW), resized to %lldx%lld\n", image_path.c_str(), static_cast<long long>(h),
              static_cast<long long>(w), static_cast<long long>(rh), static_cast<long long>(rw));

  // The compiled graph trusts its inputs: check them against the package before running.
  const std::vector<int64_t> expected{batch, 3, canvas_h, canvas_w};
  if (images.sizes().vec() != expected || images.scalar_type() != at::kFloat) {
    std::fprintf(stderr, "error: images must be float32 [%lld, 3, %lld, %lld] for this package\n",
                 static_cast<long long>(batch), static_cast<long long>(canvas_h), static_cast<long long>(canvas_w));
    return 2;
  }

  std::vector<at::Tensor> outputs;
  std::vector<double> times_ms;
  for (int i = 0; i < repeat; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    outputs = loader.run({images, image_sizes});
    times_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  if (outputs.size() != 5) throw std::runtime_error("expected 5 outputs, got " + std::to_string(outputs.size()));
  at::Tensor boxes = outputs[0][0], scores = outputs[1][0], labels = outputs[2][0], valid = outputs[4][0];

  // Boxes from resized-image to original-image pixels: per-axis float32 ratios, as postprocess.
  at::Tensor ratio = at::tensor(std::vector<float>{float(w), float(h), float(w), float(h)}) /
                     at::tensor(std::vector<float>{float(rw), float(rh), float(rw), float(rh)});
  boxes = boxes * ratio;
  const int64_t k = valid.size(0);
  const int64_t n = valid.sum().item<int64_t>();
  std::printf("detections: %lld valid of %lld slots\n", static_cast<long long>(n), static_cast<long long>(k));
  std::printf("%4s %5s %8s %9s %9s %9s %9s\n", "#", "label", "score", "x1", "y1", "x2", "y2");
  auto b = boxes.accessor<float, 2>();
  auto s = scores.accessor<float, 1>();
  auto l = labels.accessor<int64_t, 1>();
  auto v = valid.accessor<bool, 1>();
  for (int64_t i = 0, row = 0; i < k; ++i) {
    if (!v[i]) continue;
    std::printf("%4lld %5lld %8.5f %9.3f %9.3f %9.3f %9.3f\n", static_cast<long long>(row++),
                static_cast<long long>(l[i]), s[i], b[i][0], b[i][1], b[i][2], b[i][3]);
  }
  std::printf("latency: first run %.1f ms", times_ms[0]);
  if (repeat > 1) {
    std::vector<double> rest(times_ms.begin() + 1, times_ms.end());
    std::printf(", median of the next %d runs %.1f ms", repeat - 1, median(rest));
  }
  std::printf(" (%d threads)\n", at::get_num_threads());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const Usage& e) {
    std::fprintf(stderr, "error: %s\nusage: %s PACKAGE.aoti.pt2 IMAGE.ppm [--repeat N] [--threads N]\n", e.what(),
                 argv[0]);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
