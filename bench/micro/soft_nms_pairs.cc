// Micro-benchmark of one SoftNMS (batch, class) pair without onnxruntime in the loop: minimum time
// over repetitions (robust on a shared machine), per method and ISA variant, on clustered boxes like
// bench/soft_nms.py's (N/20 clusters, jitter 10 px, sides 20..100 px on 1000x1000, uniform scores).
//   g++ -O3 -std=c++17 -DORT_API_MANUAL_INIT -fno-math-errno -Iops -I$ORT_HEADERS bench/micro/soft_nms_pairs.cc \
//       ops/common/cpu.cc -o /tmp/snp && /tmp/snp
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "../../ops/soft_nms.cc"

int main() {
  using clk = std::chrono::steady_clock;
  for (int64_t n : {1000, 5000}) {
    std::mt19937_64 rng(0);
    std::uniform_real_distribution<float> u(0.f, 1.f);
    std::normal_distribution<float> jitter(0.f, 10.f);
    const int64_t k = n / 20;
    std::vector<float> cy(k), cx(k), boxes(n * 4), scores(n);
    for (int64_t c = 0; c < k; ++c) cy[c] = 50 + 900 * u(rng), cx[c] = 50 + 900 * u(rng);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t c = static_cast<int64_t>(rng() % k);
      const float y = cy[c] + jitter(rng), x = cx[c] + jitter(rng), h = 20 + 80 * u(rng), w = 20 + 80 * u(rng);
      boxes[j * 4 + 0] = y - h / 2, boxes[j * 4 + 1] = x - w / 2, boxes[j * 4 + 2] = y + h / 2, boxes[j * 4 + 3] = x + w / 2;
      scores[j] = u(rng);
    }
    std::vector<float> ext(n * 5);
    std::vector<int32_t> order(n);
    sd::Extents(boxes.data(), n, false, 0.0f, ext.data());
    sd::StrOrder(ext.data(), n, order.data());
    const sd::Isafns isas[] = {{sd::ScanPortable, sd::WeighPortable, sd::MaxPortable, sd::FirstEqualPortable},
                               {sd::ScanAvx2, sd::WeighPortable, sd::MaxAvx2, sd::FirstEqualAvx2},
                               {sd::ScanAvx512, sd::WeighAvx512, sd::MaxAvx512, sd::FirstEqualAvx512}};
    const char* isa_names[] = {"portable", "avx2", "avx512"};
    for (sd::Method method : {sd::Method::kGaussian, sd::Method::kLinear, sd::Method::kHard}) {
      sd::Params prm;
      prm.method = method;
      prm.iou_threshold = method == sd::Method::kHard ? 0.5f : 0.3f;
      prm.score_threshold = method == sd::Method::kHard ? 1e-30f : 0.001f;
      for (int isa = 0; isa < 3; ++isa) {
        if (isa > static_cast<int>(sd::SelectIsa())) continue;
        sd::Work work;
        work.Resize(n);
        std::vector<sd::Pick> out;
        double best = 1e30;
        for (int rep = 0; rep < (n > 1000 ? 40 : 200); ++rep) {
          out.clear();
          const auto t0 = clk::now();
          sd::SoftNmsOne(ext.data(), order.data(), scores.data(), n, prm, isas[isa], work, out);
          best = std::min(best, std::chrono::duration<double>(clk::now() - t0).count());
        }
        const char* name = method == sd::Method::kGaussian ? "gaussian" : method == sd::Method::kLinear ? "linear" : "hard";
        std::printf("N=%5lld %-8s %-8s kept %5zu  %.3f ms\n", static_cast<long long>(n), name, isa_names[isa], out.size(),
                    best * 1e3);
      }
    }
  }
}
