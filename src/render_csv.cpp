#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <iterator>
#include <type_traits>

#include "render.hpp"

namespace memcalc::cli {

std::string csv_header() {
    return "model,seq,micro_batch,recompute,recipe,activations,attention,parameters,state_bytes,"
           "activation_bytes,"
           "kept_activation_bytes,peak_bytes,peak_step,step_flops,recompute_flops,dp,tp,pp,cp,ep,"
           "zero,"
           "sequence_parallel,microbatches,peak_stage,peak_microbatch,grad_buffer,first_stage_"
           "layers,last_stage_layers,training,"
           "recompute_layers,usable_bytes,fits,spare_bytes\n";
}

namespace {

/// Appends one row's cells, comma-separated, through a buffer of its own: integers by
/// std::to_chars, no format string to parse, one append to the output per row.
class CsvRow {
public:
    using Cell = CsvRowWriter::Cell;
    /// `memory`: a cell per number of the row, which remembers the digits it wrote last.
    /// `continued`: the cells follow others, so the first is separated from them too.
    CsvRow(std::string& out, Cell* memory, std::size_t cells, bool continued = false)
        : out_(out), memory_(memory), memory_cells_(cells), cells_(continued ? 1 : 0) {}
    ~CsvRow() { flush(); }
    CsvRow(const CsvRow&) = delete;
    CsvRow& operator=(const CsvRow&) = delete;

    CsvRow& text(std::string_view cell) {
        separate();
        if (cell.size() > room()) flush();
        if (cell.size() > room()) return out_ += cell, *this;  // a cell longer than the buffer
        std::memcpy(buffer_ + used_, cell.data(), cell.size());
        used_ += cell.size();
        return *this;
    }
    CsvRow& number(std::uint64_t n) {
        separate();
        if (room() < 20) flush();
        if (numbers_ >= memory_cells_) {
            used_ = static_cast<std::size_t>(
                std::to_chars(buffer_ + used_, buffer_ + sizeof buffer_, n).ptr - buffer_);
            return *this;
        }
        Cell& cell = memory_[numbers_++];
        if (cell.length == 0 || cell.value != n) {  // a new value: its digits, remembered
            cell.value = n;
            cell.length = static_cast<std::uint8_t>(
                std::to_chars(cell.digits, cell.digits + sizeof cell.digits, n).ptr - cell.digits);
        }
        // Every digit the cell may hold, as two fixed moves (room() is at least that): a copy of
        // the length alone is a call.
        std::memcpy(buffer_ + used_, cell.digits, sizeof cell.digits);
        used_ += cell.length;
        return *this;
    }
    CsvRow& flag(bool b) { return text(b ? "true" : "false"); }
    /// As fmt's {:.0f}: exact digits. A whole number below 2^64 (every FLOP count here) as an
    /// integer; anything else through fmt.
    CsvRow& flops(double x) {
        if (x >= 0 && x < 18446744073709551616.0 && std::floor(x) == x)
            return number(static_cast<std::uint64_t>(x));
        separate();
        flush();
        fmt::format_to(std::back_inserter(out_), "{:.0f}", x);
        return *this;
    }
    /// Cells already made, commas and all.
    CsvRow& cells(std::string_view text) {
        ++cells_;  // the next cell is separated from these
        if (text.size() > room()) flush();
        if (text.size() > room()) return out_ += text, *this;
        std::memcpy(buffer_ + used_, text.data(), text.size());
        used_ += text.size();
        return *this;
    }
    CsvRow& step(const Step& s) {
        separate();
        flush();
        s.append_name(out_);
        return *this;
    }
    void end() {
        if (room() < 1) flush();
        buffer_[used_++] = '\n';
    }

private:
    std::size_t room() const { return sizeof buffer_ - used_; }
    void separate() {
        if (cells_++ == 0) return;
        if (room() < 1) flush();
        buffer_[used_++] = ',';
    }
    void flush() {
        out_.append(buffer_, used_);
        used_ = 0;
    }
    std::string& out_;
    Cell* memory_;
    std::size_t memory_cells_, numbers_ = 0;
    char buffer_[256];
    std::size_t used_ = 0, cells_;
};

/// What `values` are, in order: a run's key (at most 16 numbers and 2 names).
template <class... Values>
CsvRowWriter::RunKey key_of(const Values&... values) {
    CsvRowWriter::RunKey key;
    std::size_t numbers = 0, names = 0;
    const auto add = [&](const auto& v) {
        if constexpr (std::is_convertible_v<decltype(v), std::string_view>)
            key.names.at(names++) = v;
        else
            key.numbers.at(numbers++) = static_cast<std::uint64_t>(v);
    };
    (add(values), ...);
    key.count = numbers;
    return key;
}

/// `run`'s text, made again by `write` (a CsvRow over it) where `key` is not what it was made from.
template <class Write>
std::string_view run_text(CsvRowWriter::Run& run, const CsvRowWriter::RunKey& key, bool continued,
                          Write write) {
    const auto numbers = key.numbers.begin(), end = numbers + static_cast<long>(key.count);
    if (run.text.empty() || !std::equal(numbers, end, run.numbers.begin()) ||
        run.names[0] != key.names[0] || run.names[1] != key.names[1]) {
        run.text.clear();
        CsvRow row(run.text, nullptr, 0, continued);
        write(row);
        run.numbers = key.numbers;
        run.names[0] = key.names[0], run.names[1] = key.names[1];
    }
    return run.text;
}

/// What the layout's cells are made from: the degrees, the schedule's micro-batches, where the
/// peak is, the loop's buffer, the stages' layers, what trains and what is recomputed.
CsvRowWriter::RunKey layout_key(const Summary& r) {
    const Parallelism& p = r.settings.parallel;
    return key_of(p.dp, p.tp, p.pp, p.cp, p.ep, p.zero, p.sequence_parallel, p.steps_per_batch(),
                  r.peak_stage, r.peak.microbatch,
                  static_cast<int>(r.settings.framework.grad_buffer), p.first_stage_layers,
                  p.last_stage_layers, static_cast<int>(r.settings.tuning.mode),
                  p.recompute_layers.has_value(), p.recompute_layers.value_or(0));
}

void layout_cells(CsvRow& row, const Summary& r) {
    const Settings& s = r.settings;
    const Parallelism& p = s.parallel;
    row.number(p.dp).number(p.tp).number(p.pp).number(p.cp).number(p.ep).number(p.zero);
    row.flag(p.sequence_parallel)
        .number(p.steps_per_batch())
        .number(r.peak_stage)
        .number(r.peak.microbatch);
    row.text(grad_buffer_name(s.framework.grad_buffer))
        .number(p.first_stage_layers)
        .number(p.last_stage_layers);
    row.text(training_name(
        s.tuning.mode));  // what trains, as --train spells it (appended: earlier columns stay)
    if (p.recompute_layers)
        row.number(*p.recompute_layers);
    else
        row.text("");  // every layer of the recomputation
}

}  // namespace

void CsvRowWriter::append(std::string& out, std::string_view model, const Summary& r) {
    const Settings& s = r.settings;
    CsvRow row(out, cells_.data(), cells_.size());
    row.cells(run_text(first_, key_of(model, s.seq), false,
                       [&](CsvRow& c) { c.text(csv_field(model)).number(s.seq); }));
    row.number(s.micro_batch);
    const std::string_view recompute = recompute_name(s.recompute);
    row.cells(run_text(settings_,
                       key_of(recompute, s.recipe.name, static_cast<int>(s.activations),
                              static_cast<int>(s.framework.attention), r.parameters.value(),
                              r.state.total().value()),
                       true, [&](CsvRow& c) {
                           c.text(recompute).text(s.recipe.name);
                           c.text(activation_model_name(s.activations))
                               .text(attention_name(s.framework.attention));
                           c.number(r.parameters.value()).number(r.state.total().value());
                       }));
    row.number(r.activations.value());
    row.number(r.kept_activations.value()).number(r.peak.bytes.total().value());
    const Step& peak = r.peak;
    row.cells(run_text(step_, key_of(static_cast<int>(peak.phase), peak.layer, peak.microbatch),
                       true, [&](CsvRow& c) { c.step(peak); }));
    row.flops(r.compute.step).flops(r.compute.recompute);
    row.cells(run_text(layout_, layout_key(r), true, [&](CsvRow& c) { layout_cells(c, r); }));
    if (device) {  // the verdict, with a device (DeviceFit); empty cells without
        const Count peak = r.device ? *r.device : r.peak.bytes.total();
        const std::int64_t spare = device->spare(peak);
        row.number(device->usable().value()).flag(device->fits(peak));
        row.text(spare < 0 ? "-" + std::to_string(-spare) : std::to_string(spare));
    } else {
        row.text("").text("").text("");
    }
    row.end();
}

std::string csv_row(const Report& r, const View& view) {
    std::string out;
    CsvRowWriter writer;
    if (view.device_memory) writer.device = DeviceFit{*view.device_memory, view.reserve};
    Summary row = summary(r);
    if (view.device_memory)  // the figure only a verdict reads
        if (const std::optional<DeviceFigures> d = fullest_device(r, view))
            row.device = d->high_bytes;
    writer.append(out, r.model.name, row);
    return out;
}

std::string per_layer_csv(const Report& r) {
    // A model of several kinds of layer gets a first column naming each row's kind.
    const bool mixed = r.parameters->kinds > 1;
    std::string out = std::string(mixed ? "kind," : "") +
                      "op,tensor,symbol,copies,bytes_per_element,elements,bytes,keep\n";
    for (std::size_t k = 0; k < r.parameters->kinds; ++k)
        for (const auto& t : r.layer_of(k).rows)
            out += (mixed ? csv_field(r.model.layer_kinds[k].name) + "," : std::string()) +
                   fmt::format("{},{},{},{},{},{},{},{}\n", csv_field(t.op), csv_field(t.tensor),
                               t.symbol, t.copies, t.bytes_per_element, t.elements.value(),
                               t.bytes.value(), keep_name(t.keep));
    return out;
}

}  // namespace memcalc::cli
