#pragma once
// Turning reports into text: the one place that knows what the program prints.
#include <array>
#include <memory>
#include <optional>
#include <variant>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "memcalc/device_memory.hpp"
#include "memcalc/estimate.hpp"
#include "memcalc/fit.hpp"
#include "memcalc/hardware.hpp"
#include "memcalc/loading.hpp"
#include "memcalc/plan.hpp"
#include "memcalc/units.hpp"
#include "model_file.hpp"

namespace memcalc::cli {

enum class Format { table, json, csv };

/// A catalogue (presets, recipes, ...) as rows of cells: JSON shows every column under its key, CSV
/// and the table the columns they list, in their order.
struct Listing {
    /// How the table shows a number: 16, 6,738,415,616, 16 B, or in thousands of millions (989.4
    /// for 989,400,000,000,000 FLOP/s as tera, 450 for 450,000,000,000 B/s as giga); none shows as
    /// "-".
    enum class Style { plain, digits, bytes, tera, giga };
    struct Column {
        const char* key;      ///< the JSON key and CSV heading
        const char* heading;  ///< the table's heading
        Style style = Style::plain;
    };
    using Cell = std::variant<std::monostate, std::string, std::uint64_t, bool,
                              double>;  ///< monostate: none (JSON null)
    std::vector<Column> columns;
    std::vector<std::vector<Cell>> rows;
    std::vector<std::size_t> table, csv;  ///< the columns each shows, in order
};
std::string render_listing(const Listing& listing, Format format);
Listing presets_listing(const std::vector<std::pair<std::string, ModelFile>>& presets);
Listing recipes_listing();
Listing profiles_listing();
Listing gpus_listing();
Listing activation_functions_listing();
Listing program_facts_listing();  ///< program_facts.hpp's rows
Listing optimizers_listing();     ///< optimizer.hpp's rows: state, and how each steps

/// The one rule of estimate, fit, plan and serve: a peak fits when it is at most the device's
/// memory less the reserve (--reserve: the framework's context, the allocator's fragmentation).
struct DeviceFit {
    Count memory, reserve;
    Count usable() const { return Count(memory.value() - reserve.value()); }
    bool fits(Count peak) const { return peak <= usable(); }
    /// Bytes to spare, negative when over.
    std::int64_t spare(Count peak) const {
        return static_cast<std::int64_t>(usable().value()) -
               static_cast<std::int64_t>(peak.value());
    }
};

struct View {
    Unit unit = Unit::gb;
    bool full_timeline = false;  ///< every step rather than the compact list
    std::string compare;         ///< "megatron" or "deepspeed": add that tool's figures
    std::uint64_t gpus_per_node = 8;
    std::optional<Count>
        device_memory;  ///< when given: drawn in plots, and the peak checked against it
    std::optional<Count>
        host_memory;        ///< when given: what offload keeps in host memory checked against it
    Count reserve{0};       ///< kept out of device_memory when the peak is checked (DeviceFit)
    DeviceSettings device;  ///< the allocator's settings and the GPU's facts
    bool device_figures = true;  ///< report reserved and device figures (one configuration)
    const LoadingMethod* loading = nullptr;  ///< --loading; none: the layout's default
};

/// The timeline's categories with their JSON keys and printed labels, in print order.
struct Category {
    const char* key;
    const char* label;
    Count Breakdown::*member;
};
inline constexpr std::array<Category, 11> categories{{
    {"weights", "weights", &Breakdown::weights},
    {"master_weights", "master weights", &Breakdown::master_weights},
    {"optimizer_state", "optimizer state", &Breakdown::optimizer_state},
    {"gradients", "gradients", &Breakdown::gradients},
    {"gathered_weights", "gathered weights (ZeRO-3)", &Breakdown::gathered_weights},
    {"kept_activations", "kept activations", &Breakdown::kept_activations},
    {"rebuilt_activations", "rebuilt activations", &Breakdown::rebuilt_activations},
    {"logits", "logits and loss", &Breakdown::logits},
    {"activation_gradient", "activation gradient", &Breakdown::activation_gradient},
    {"workspace", "workspace", &Breakdown::workspace},
    {"weight_copies", "weight copies (autocast, fp8, fp4)",
     &Breakdown::weight_copies},  // last: CSV columns keep their places
}};

/// A fit's question and answers, for rendering.
struct FitRequest {
    Architecture model;
    Settings
        settings;  ///< the last mode's; everything but the searched size and the mode is common
    FitDimension dimension = FitDimension::seq;
    std::uint64_t fixed = 1;  ///< the size that is not searched
    std::uint64_t granule = 1;
    Count memory, reserve, capacity;
    std::optional<DeviceSettings> device;  ///< the verdicts weigh the device figure
    std::vector<Recompute> modes;
    std::vector<FitResult> results;  ///< one per mode
};

std::string fit_table(const FitRequest& f, Unit unit);
nlohmann::json fit_json(const FitRequest& f);
std::string fit_csv(const FitRequest& f);

/// A plan's question and its ranked layouts, for rendering.
struct PlanView {
    std::string model;
    PlanRequest request;
    Count memory, reserve;
    PlanSummary result;  ///< the best `top` fitting layouts, and the counts
    std::size_t top = 10;
    /// Without --gpus: the count was searched for, in steps of this many (a node's GPUs, or 1).
    std::optional<std::uint64_t> fewest_step;
    double seconds = 0;  ///< how long the search took
};

std::string plan_table(const PlanView& v, Unit unit);
nlohmann::json plan_json(const PlanView& v);
std::string plan_csv(const PlanView& v);
std::string layout_text(const Parallelism& p);
/// " (first N layers of each stage)" under partial recomputation, else nothing.
std::string recompute_layers_text(const Parallelism& p);

// Pictures (plain SVG).
std::string timeline_svg(const Report& r, std::optional<Count> device, Unit unit);
/// One configuration of a plotted sweep.
struct SweepPoint {
    std::uint64_t seq = 0, micro_batch = 0;
    Recompute recompute = Recompute::none;
    Count peak;
};
std::string sweep_svg(const std::string& model, const std::vector<SweepPoint>& points, bool by_seq,
                      std::optional<Count> device, Unit unit);

// Tables for people.
std::string report_table(const Report& r, const View& view);
std::string compare_table(const Report& r, const View& view);
nlohmann::json compare_json(const Report& r, const View& view);
std::vector<Count> compare_figures(const Report& r,
                                   const View& view);  ///< the other tool's headline figures
std::string per_layer_table(const Report& r, const View& view);
/// Each kind's op tape as a table: `--ops`.
std::string ops_table(const Report& r, const View& view);
/// A sweep's table, a row a configuration: only the row's text is kept, not the report.
class SweepTable {
public:
    explicit SweepTable(const View& view);
    ~SweepTable();
    void add(const Report& r);
    std::string str() const;

private:
    struct Rows;
    View view_;
    std::unique_ptr<Rows> rows_;
};

// JSON for programs: exact integer bytes.
nlohmann::json report_json(const Report& r, const View& view);
nlohmann::json per_layer_json(const Report& r);
/// Each kind's op tape (Report::ops) into `activations`: `ops` (the first kind's), and each entry
/// of `layer_kinds` its own.
void add_ops_json(nlohmann::json& activations, const Report& r);

// CSV for scripts: one row per configuration, the same columns every time.
std::string csv_header();
std::string csv_row(const Report& r, const View& view = {});
/// A sweep's rows, one summary at a time. Most cells repeat from row to row (the layout, the
/// parameters, the state): each run of them keeps its text with the values it was made from, and
/// each number cell between them its last digits.
class CsvRowWriter {
public:
    struct Cell {
        std::uint64_t value = 0;
        std::uint8_t length = 0;  ///< 0: nothing written yet
        char digits[20];
    };
    /// What a run of cells is made from: its numbers and names, in order.
    struct RunKey {
        std::array<std::uint64_t, 16> numbers{};
        std::size_t count = 0;  ///< of numbers
        std::array<std::string_view, 2> names{};
    };
    /// A run of cells' text and what it was made from.
    struct Run {
        std::array<std::uint64_t, 16> numbers{};
        std::array<std::string, 2> names;
        std::string text;
    };
    /// The row of `r`, appended to `out`.
    void append(std::string& out, std::string_view model, const Summary& r);
    std::optional<DeviceFit> device;  ///< the verdict's columns, where a device is given

private:
    std::array<Cell, 8> cells_{};
    /// model and seq; recompute .. state; peak_step; dp .. recompute_layers
    Run first_, settings_, step_, layout_;
};
std::string per_layer_csv(const Report& r);
/// Each kind's op tape, a row an event (with its kind's name when there are several).
std::string ops_csv(const Report& r);

// Shared by the renderers.
/// The fullest device's figures (device_memory.hpp) where the report has timelines on CUDA and
/// the view asks for them; none otherwise.
std::optional<DeviceFigures> fullest_device(const Report& r, const View& view);
/// Every rank's figures, the fullest first (none where fullest_device has none).
std::vector<DeviceFigures> every_device(const Report& r, const View& view);
/// The loading peak of the rank that peaks highest while loading, by --loading or the layout's
/// default; `fits` against the device (its rows and fragmentation as the step's) where given.
struct LoadingView {
    LoadingPeak peak;
    Count device_high;         ///< device_bytes with the step's rows and fragmentation beside it
    std::optional<bool> fits;  ///< none without a device
};
LoadingView loading_view(const Report& r, const View& view,
                         const std::optional<DeviceFigures>& device);
/// The peak a verdict weighs: the device figure's high end where there is one, else allocated.
Count verdict_peak(const Report& r, const std::optional<DeviceFigures>& device);
/// A figure and what it is.
struct Figure {
    Count bytes;
    std::string note;
};
/// "On the device"'s lines: allocated, the rows inside the allocator, reserved, the rows outside
/// it, and the device figure (nvidia-smi's).
std::string device_lines(const Figure& allocated, const std::vector<DeviceRow>& rows,
                         const Figure& reserved, Count device, Unit unit);
/// "caching allocator; h100-sxm's rows"
std::string device_settings_text(const DeviceSettings& device, Unit unit);
/// The rows beside the model's tensors: inside the allocator (within reserved_bytes) or outside.
nlohmann::json device_rows_json(const std::vector<DeviceRow>& rows);
/// The allocator's settings and the GPU whose rows were taken.
nlohmann::json device_settings_json(const DeviceSettings& device);
std::string digits(Count n);                 ///< 6,738,415,616
std::string amount(Count bytes, Unit unit);  ///< 107.8 GB, 4.9 kB, 12 B
struct Scale {
    double divisor;
    const char* name;  ///< "GB", "MiB", "B"
};
Scale scale_for(Count largest, Unit unit);  ///< the largest prefix that keeps `largest` >= 1
std::string scaled(Count bytes, const Scale& scale);       ///< "107.8" in that prefix
std::string layer_formula(const LayerActivations& layer);  ///< "34 sbh + 5 as^2b"
std::string csv_field(std::string_view text);

}  // namespace memcalc::cli
