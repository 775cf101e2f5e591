/* Steady dashboard: charts (uPlot) and live updates. Data is only ever written with textContent. */
(function () {
  "use strict";

  const $ = (sel, root) => (root || document).querySelector(sel);
  const $$ = (sel, root) => Array.from((root || document).querySelectorAll(sel));
  const COLORS = {
    mean: "#1f4e79", ti: "rgba(31,78,121,0.20)", range: "rgba(31,78,121,0.08)", edge: "rgba(31,78,121,0.35)",
    run: "rgba(70,70,70,0.28)", running: "#d9822b", div: "#b3261e",
  };

  function loginRedirect() {
    location.href = "/login?next=" + encodeURIComponent(location.pathname + location.search);
  }

  async function getJSON(url) {
    const r = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (r.status === 401) { loginRedirect(); throw new Error("login required"); }
    if (!r.ok) throw new Error(url + " answered " + r.status);
    return r.json();
  }

  function fmt(v) {
    if (typeof v === "string") return v;  // "NaN", "Infinity", "-Infinity": the API's non-finite values
    if (v === null || v === undefined || Number.isNaN(v)) return "—";
    const a = Math.abs(v);
    if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(3);
    return String(+v.toPrecision(5));
  }

  function lastValue(arr) {
    for (let i = arr.length - 1; i >= 0; i--) if (arr[i] !== null) return arr[i];
    return null;
  }

  function plotWidth(el) { return Math.max(320, Math.floor(el.getBoundingClientRect().width)); }

  /* Draw the first divergent step and the points where runs diverged, on top of the series. */
  function markerHook(d) {
    return (u) => {
      const ctx = u.ctx;
      ctx.save();
      if (d.first_divergent_step !== null && d.first_divergent_step !== undefined) {
        const x = u.valToPos(d.first_divergent_step, "x", true);
        ctx.strokeStyle = COLORS.div;
        ctx.lineWidth = 1.5 * devicePixelRatio;
        ctx.setLineDash([5 * devicePixelRatio, 4 * devicePixelRatio]);
        ctx.beginPath();
        ctx.moveTo(x, u.bbox.top);
        ctx.lineTo(x, u.bbox.top + u.bbox.height);
        ctx.stroke();
        ctx.setLineDash([]);
      }
      ctx.fillStyle = COLORS.div;
      ctx.font = `bold ${14 * devicePixelRatio}px system-ui, sans-serif`;
      ctx.textAlign = "center";
      ctx.textBaseline = "middle";
      for (const ln of (d.lines || [])) {
        if (ln.diverged_at === null) continue;
        const x = u.valToPos(ln.diverged_at, "x", true);
        const y = ln.diverged_value === null ? u.bbox.top + 8 * devicePixelRatio
          : Math.max(u.bbox.top, Math.min(u.bbox.top + u.bbox.height, u.valToPos(ln.diverged_value, "y", true)));
        ctx.fillText("×", x, y);
      }
      ctx.restore();
    };
  }

  function lineSeries(label, stroke, width, extra) {
    return Object.assign({ label, stroke, width, spanGaps: true, points: { show: false } }, extra || {});
  }

  /* What the band is and over how many runs, as the legend and exports (steady report --tensorboard) say it. */
  function bandMeaning(b) {
    const pct = (x) => `${Math.round(x * 1000) / 10}%`;
    return `tolerance interval: covers ${pct(b.coverage)} of runs with ${pct(b.confidence)} confidence, N = ${b.n} runs`;
  }

  function bandSummary(d, group) {
    const parts = [];
    parts.push(`${d.metric}, ${group}: ${d.n_runs} run(s)`);
    if (d.band) {
      const s = d.series;
      parts.push(`band over ${d.band.n} seed(s), final mean ${fmt(lastValue(s.mean))}, ` +
        `tolerance interval ${fmt(lastValue(s.ti_low))} … ${fmt(lastValue(s.ti_high))}, ` +
        `range ${fmt(lastValue(s.min))} … ${fmt(lastValue(s.max))}`);
    } else {
      parts.push("no completed run yet, so no band");
    }
    parts.push(`${d.n_lines} run line(s) drawn${d.lines_capped ? ` (capped, of ${d.n_runs_with_data})` : ""}`);
    parts.push(`${d.points} of ${d.total_steps} steps plotted${d.downsampled ? " (decimated, extremes kept)" : ""}`);
    if (d.first_divergent_step !== null && d.first_divergent_step !== undefined) {
      parts.push(`repeats first diverge at step ${d.first_divergent_step}`);
    }
    const div = (d.lines || []).filter((l) => l.diverged_at !== null);
    if (div.length) parts.push("diverged: " + div.map((l) => `run ${l.run_id} at step ${l.diverged_at}`).join(", "));
    const running = (d.lines || []).filter((l) => l.status === "running").length;
    if (running) parts.push(`${running} running`);
    return parts.join("; ") + ".";
  }

  /* Known bounds of a metric, by name: accuracies live in [0, 1]; losses, errors and times are >= 0. */
  function metricBounds(name) {
    const n = name.toLowerCase();
    if (/(^|[_./-])(acc|accuracy|precision|recall|f1|auc)([_./-]|$)/.test(n)) return [0, 1];
    if (/loss|mse|mae|rmse|error|perplexity|time|nll/.test(n)) return [0, Infinity];
    return [-Infinity, Infinity];
  }

  function isLossLike(name) { return /loss|mse|mae|rmse|error|perplexity|nll/.test(name.toLowerCase()); }

  /* The y range of the runs themselves (not of the tolerance interval, which with few seeds is
     wide enough to swamp them), padded a little and clipped at the metric's known bounds. */
  function runRange(arrays, name, log) {
    let lo = Infinity, hi = -Infinity;
    for (const arr of arrays) {
      for (const v of arr) {
        if (v === null || !Number.isFinite(v) || (log && v <= 0)) continue;
        if (v < lo) lo = v;
        if (v > hi) hi = v;
      }
    }
    if (!Number.isFinite(lo)) return null;
    if (log) return [lo / 1.15, hi * 1.15];
    const pad = (hi - lo) * 0.06 || Math.abs(hi) * 0.01 || 1;
    const [bmin, bmax] = metricBounds(name);
    return [Math.max(bmin, lo - pad), Math.min(bmax, hi + pad)];
  }

  const STEP_INCRS = [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1e3, 2e3, 2.5e3, 5e3, 1e4, 2e4, 2.5e4, 5e4,
    1e5, 2e5, 2.5e5, 5e5, 1e6, 2e6, 5e6, 1e7];

  /* Tick labels: as few digits as say each tick's value (150 must not print as "200") and tell
     neighbouring ticks apart (no repeated labels). */
  function tickValues(u, splits) {
    const finite = splits.filter((v) => v !== null);
    let gap = Infinity;
    for (let i = 1; i < finite.length; i++) gap = Math.min(gap, Math.abs(finite[i] - finite[i - 1]));
    const close = (label, v) => Math.abs(+label - v) <= 1e-6 * (Number.isFinite(gap) && gap > 0 ? gap : Math.abs(v) || 1);
    for (let p = 1; p <= 12; p++) {
      const labels = splits.map((v) => (v === null ? "" : String(+v.toPrecision(p))));
      const exact = splits.every((v, i) => v === null || close(labels[i], v));
      if (exact && new Set(labels).size === labels.length) return labels.map((l, i) => (Math.abs(splits[i]) >= 1e5 || (splits[i] !== 0 && Math.abs(splits[i]) < 1e-3) ? (+splits[i]).toExponential(Math.max(0, p - 1)) : l));
    }
    return splits.map(String);
  }

  /* Room for the widest tick label plus the axis title, so the title never sits on the labels. */
  function axisSize(u, values, axisIdx, cycleNum) {
    const longest = (values || []).reduce((m, v) => Math.max(m, String(v).length), 0);
    return Math.ceil(longest * 7.2) + 34;
  }

  function yAxis(label, log) {
    return { label: label + (log ? " (log)" : ""), size: axisSize, values: tickValues, gap: 4 };
  }

  function xAxis() {
    return { label: "step", size: 44, incrs: STEP_INCRS, values: tickValues };
  }

  function unitLabel(key) { return key === "step_time" || /(_|^)time$/.test(key) ? `${key} (s)` : key; }

  /* Chart values are numbers, the strings "NaN" / "Infinity" / "-Infinity" (a logged non-finite
     value) or null (no point): uPlot draws numbers, and a gap for everything else. */
  function drawable(arr) { return arr.map((v) => (typeof v === "number" ? v : null)); }

  function positive(arr, log) { const a = drawable(arr); return log ? a.map((v) => (v !== null && v > 0 ? v : null)) : a; }

  function valueFmt(u, v) { return v === null || v === undefined ? "—" : fmt(v); }

  function bandOpts(d, width, log) {
    const data = [d.x];
    const series = [{ label: "step", value: (u, v) => (v === null || v === undefined ? "—" : String(v)) }];
    const bands = [];
    // The band first, the runs on top: the tolerance interval never hides a run.
    if (d.series) {
      const base = 1;
      data.push(positive(d.series.max, log), positive(d.series.min, log), positive(d.series.ti_high, log),
        positive(d.series.ti_low, log), positive(d.series.mean, log));
      series.push(
        lineSeries("max", COLORS.edge, 0.5, { value: valueFmt }),
        lineSeries("min", COLORS.edge, 0.5, { value: valueFmt }),
        lineSeries("tolerance high", COLORS.mean, 1, { dash: [4, 3], value: valueFmt }),
        lineSeries("tolerance low", COLORS.mean, 1, { dash: [4, 3], value: valueFmt }),
        lineSeries("mean", COLORS.mean, 2, { value: valueFmt }),
      );
      bands.push({ series: [base, base + 1], fill: COLORS.range }, { series: [base + 2, base + 3], fill: COLORS.ti });
    }
    // Faint lines: the more runs, the fainter each, so the band stays readable.
    const alpha = Math.max(0.12, Math.min(0.45, 4 / Math.max(1, d.lines.length)));
    d.lines.forEach((ln, i) => {
      data.push(positive(d.y[i], log));
      const running = ln.status === "running";
      series.push(lineSeries(`run ${ln.run_id}`, running ? COLORS.running : `rgba(70,70,70,${alpha})`,
        running ? 1.5 : 1, { value: valueFmt }));
    });
    const range = runRange(d.lines.length ? d.y : [d.series ? d.series.mean : []], d.metric, log);
    return {
      opts: {
        width, height: 300, series, bands,
        legend: { show: true, live: true },
        cursor: { drag: { x: true, y: false }, points: { show: false } },
        scales: { x: { time: false }, y: Object.assign(log ? { distr: 3 } : {}, range ? { range: () => range } : {}) },
        axes: [xAxis(), yAxis(unitLabel(d.metric), log)],
        hooks: { draw: [markerHook(d)] },
      },
      data,
    };
  }

  const DIFF_COLORS = ["#1f4e79", "#b3261e", "#2e7d32", "#d9822b", "#6a1b9a", "#00838f", "#5d4037", "#c2185b"];

  /* Each repeat minus its seed's reference repeat: one line per (seed, repeat), zero drawn. */
  function diffOpts(d, width, height) {
    const data = [d.x];
    const series = [{ label: "step", value: (u, v) => (v === null || v === undefined ? "—" : String(v)) }];
    const ulp = d.unit === "ulp";
    d.lines.forEach((ln, i) => {
      const per = ln.basis === "printed" ? ` × ${ln.resolution} (printed digit)` : " ULP";
      data.push(drawable(d.y[i]));
      series.push(lineSeries(`run ${ln.run_id} − run ${ln.reference_run_id}`, DIFF_COLORS[i % DIFF_COLORS.length],
        1.25, { value: ulp ? (u, v) => (v === null || v === undefined ? "—" : `${v}${per}`) : valueFmt }));
    });
    const marker = { first_divergent_step: d.first_nonzero_step, lines: [] };
    const label = !ulp ? `${d.metric}: Δ from reference repeat`
      : d.basis === "printed" ? `${d.metric}: last printed digits from reference repeat`
        : `${d.metric}: ULPs from reference repeat`;
    return {
      opts: {
        width, height: height || 300, series,
        legend: { show: true, live: true },
        cursor: { drag: { x: true, y: false }, points: { show: false } },
        scales: { x: { time: false }, y: { range: (u, lo, hi) => (lo === hi ? [lo - 1, hi + 1] : [Math.min(0, lo), Math.max(0, hi)]) } },
        axes: [xAxis(), yAxis(label, false)],
        hooks: { draw: [markerHook(marker)] },
      },
      data,
    };
  }

  function diffSummary(d, group) {
    const printed = d.unit === "ulp" && d.basis === "printed";
    const unit = d.unit !== "ulp" ? "difference"
      : printed ? "difference in units of the last printed digit (values parsed from text carry no binary precision)"
        : "ULP distance";
    const parts = [`${d.metric}, ${group}: ${unit} of each repeat from its seed's reference repeat`];
    parts.push(`${d.n_lines} repeat(s) over ${d.n_seeds_with_repeats} seed(s)`);
    if (d.first_nonzero_step !== null) parts.push(`repeats first part at step ${d.first_nonzero_step}`);
    parts.push(`largest |Δ| ${d.unit !== "ulp" ? fmt(d.max_abs) : d.max_abs + (printed ? " printed digit(s)" : " ULP")}`);
    parts.push(`${d.points} of ${d.total_steps} steps plotted${d.downsampled ? " (decimated, extremes and first difference kept)" : ""}`);
    return parts.join("; ") + ".";
  }

  class ChartSlot {
    constructor(figure) {
      this.figure = figure;
      this.plotEl = $("[data-plot]", figure);
      this.summaryEl = $("[data-summary]", figure);
      this.captionEl = $("[data-chart-caption]", figure);
      this.plot = null;
    }

    clear() {
      if (this.plot) { this.plot.destroy(); this.plot = null; }
      for (const p of this.minis || []) p.destroy();
      this.minis = [];
      this.plotEl.replaceChildren();
      delete this.figure.dataset.miniCount;
    }

    /* One small chart per item ({title, build(width) | message}), side by side, wrapping. */
    showMany(items, summary, caption) {
      this.clear();
      this.plotEl.setAttribute("aria-label", summary);
      this.summaryEl.textContent = summary;
      this.captionEl.textContent = caption;
      const row = document.createElement("div");
      row.className = "multiples";
      this.plotEl.append(row);
      const pending = [];
      for (const item of items) {
        const cell = document.createElement("div");
        cell.className = "mini";
        cell.dataset.level = item.level;
        const title = document.createElement("p");
        title.className = "mini-title";
        title.textContent = item.title;
        cell.append(title);
        row.append(cell);
        if (!item.build) {
          const msg = document.createElement("p");
          msg.className = "empty small";
          msg.textContent = item.message;
          cell.append(msg);
          continue;
        }
        const holder = document.createElement("div");
        cell.append(holder);
        pending.push([item, cell, holder]);
      }
      // Measure once every cell is laid out: each one's width is its share of the row.
      const widths = pending.map(([, cell]) => Math.max(260, Math.floor(cell.getBoundingClientRect().width)));
      pending.forEach(([item, , holder], i) => {
        const built = item.build(widths[i]);
        this.minis.push(new uPlot(built.opts, built.data, holder));
      });
      this.figure.dataset.miniCount = String(items.length);
      this.figure.dataset.seriesCount = "0";
      this.figure.dataset.lineCount = "0";
      this.figure.dataset.ready = "true";
    }

    show(built, summary, caption) {
      this.clear();
      this.plotEl.setAttribute("aria-label", summary);
      this.summaryEl.textContent = summary;
      this.captionEl.textContent = caption;
      if (built) {
        this.plot = new uPlot(built.opts, built.data, this.plotEl);
        this.figure.dataset.seriesCount = String(built.data.length - 1);
        this.figure.dataset.lineCount = String(built.lineCount);
      } else {
        this.figure.dataset.seriesCount = "0";
        this.figure.dataset.lineCount = "0";
      }
      this.figure.dataset.ready = "true";
    }

    message(text) {
      this.show(null, text, "");
    }

    logScale() {
      const box = $("input[data-log-scale]", this.figure);
      return Boolean(box && box.checked);
    }

    resize() {
      if (this.plot) this.plot.setSize({ width: plotWidth(this.plotEl), height: this.plot.height });
      for (const p of this.minis || []) {
        p.setSize({ width: Math.max(260, Math.floor(p.root.parentElement.getBoundingClientRect().width)), height: p.height });
      }
    }
  }

  /* ------------------------------------------------------------------ study page */

  function initStudy(main) {
    const studyId = main.dataset.studyId;
    const slots = $$("figure[data-metric]").map((f) => new ChartSlot(f));
    let groups = JSON.parse($("#groups-data").textContent || "[]");
    let drawing = 0;

    function selection() {
      const level = $("#sel-level"), stack = $("#sel-stack"), view = $("#sel-view");
      return { determinism: level ? level.value : null, stack: stack ? stack.value : null,
               view: view ? view.value : "values" };
    }

    function levelsShown(sel) {
      if (sel.determinism !== "all") return [sel.determinism];
      return Array.from($("#sel-level").options).map((o) => o.value).filter((v) => v !== "all");
    }

    function syncStackOptions() {
      const level = $("#sel-level"), stack = $("#sel-stack");
      if (!level || !stack) return;
      const available = new Set(groups.filter((g) => level.value === "all" || g[0] === level.value).map((g) => g[1]));
      for (const opt of stack.options) opt.disabled = !available.has(opt.value);
      if (stack.selectedOptions[0] && stack.selectedOptions[0].disabled) {
        const first = Array.from(stack.options).find((o) => !o.disabled);
        if (first) stack.value = first.value;
      }
    }

    /* Fetch one group's chart in the selected view: {summary, caption, build(width, height)} or {message}. */
    async function loadGroup(slot, metric, determinism, stack, view) {
      const group = `${determinism} · ${stack}`;
      const q = new URLSearchParams({ metric, determinism, stack });
      if (view !== "values") {
        q.set("unit", view);
        const d = await getJSON(`/dashboard/data/studies/${studyId}/difference?${q}`);
        const info = { d, group, firstNonzeroStep: d.first_nonzero_step, maxAbs: d.max_abs, identical: d.identical };
        if (!d.n_lines) return Object.assign(info, { message: `${metric}, ${group}: no seed has two repeats with data, so there is no difference to draw.` });
        const same = d.printed_resolution ? `repeats equal to their last printed digit (${d.printed_resolution}, values parsed from text)` : "repeats bitwise identical";
        if (d.identical) return Object.assign(info, { message: `${metric}, ${group}: ${same}: no difference to draw (${d.n_lines} repeat(s) over ${d.n_seeds_with_repeats} seed(s)).` });
        return Object.assign(info, {
          summary: diffSummary(d, group), lineCount: d.n_lines,
          caption: `${group} · ${d.n_lines} repeat(s) against their seed's reference` + (view === "ulp" ? " · in ULPs" : ""),
          build: (width, height) => diffOpts(d, width, height),
        });
      }
      const d = await getJSON(`/dashboard/data/studies/${studyId}/chart?${q}`);
      if (!d.x.length) {
        const ended = ["failed", "cancelled", "completed"].includes(main.dataset.studyStatus);
        return { d, group, message: ended ? `${metric}, ${group}: no run of this group recorded a point (the study is ${main.dataset.studyStatus}; see the runs below).`
          : `${metric}, ${group}: no points recorded yet.` };
      }
      return {
        d, group, summary: bandSummary(d, group), lineCount: d.n_lines,
        caption: `${group} · ${d.n_lines} run line(s)` + (d.band ? ` · band of ${d.band.n} seed(s)` : ""),
        build: (width, height) => {
          const built = bandOpts(d, width, slot.logScale());
          if (height) built.opts.height = height;
          return built;
        },
      };
    }

    function mark(slot, info) {
      const ds = slot.figure.dataset;
      for (const k of ["firstNonzeroStep", "maxAbs", "identical"]) delete ds[k];
      if (info && info.maxAbs !== undefined) {
        ds.firstNonzeroStep = info.firstNonzeroStep === null ? "" : String(info.firstNonzeroStep);
        ds.maxAbs = String(info.maxAbs);
        ds.identical = String(info.identical);
      }
    }

    async function drawAll() {
      const ticket = ++drawing;
      const sel = selection();
      if (!sel.determinism) return;
      main.dataset.chartsReady = "false";
      const levels = levelsShown(sel);
      await Promise.all(slots.map(async (slot) => {
        const metric = slot.figure.dataset.metric;
        slot.figure.dataset.view = sel.view;
        const key = $("ul.legend", slot.figure);
        if (key) key.hidden = sel.view !== "values";
        try {
          if (levels.length === 1) {
            const info = await loadGroup(slot, metric, levels[0], sel.stack, sel.view);
            if (ticket !== drawing) return;
            slot.figure.dataset.group = info.group;
            mark(slot, info);
            if (!info.build) { slot.last = null; slot.message(info.message); return; }
            slot.last = info;
            const built = info.build(plotWidth(slot.plotEl));
            built.lineCount = info.lineCount;
            slot.show(built, info.summary, info.caption);
            const meaning = $("[data-band-meaning]", slot.figure);
            if (meaning) meaning.textContent = info.d && info.d.band ? bandMeaning(info.d.band) : "tolerance interval";
            return;
          }
          const infos = await Promise.all(levels.map((level) => loadGroup(slot, metric, level, sel.stack, sel.view)));
          if (ticket !== drawing) return;
          slot.last = null;
          slot.figure.dataset.group = `all levels · ${sel.stack}`;
          mark(slot, null);
          const items = infos.map((info, i) => ({
            level: levels[i], title: info.group, message: info.message,
            build: info.build ? (width) => info.build(width, 220) : null,
          }));
          slot.showMany(items, infos.map((info) => info.summary || info.message).join(" "),
            `${levels.join(", ")} side by side · ${sel.stack}`);
        } catch (err) {
          if (ticket === drawing) slot.message(`Could not load the chart: ${err.message}`);
        }
      }));
      if (ticket === drawing) main.dataset.chartsReady = "true";
    }

    function redraw(slot) {
      if (!slot.last) { drawAll(); return; }
      const built = slot.last.build(plotWidth(slot.plotEl));
      built.lineCount = slot.last.lineCount;
      slot.show(built, slot.last.summary, slot.captionEl.textContent);
    }

    for (const slot of slots) {
      const box = $("input[data-log-scale]", slot.figure);
      if (box) box.addEventListener("change", () => redraw(slot));
    }

    function bindSelectors() {
      const level = $("#sel-level"), stack = $("#sel-stack"), view = $("#sel-view");
      if (level) level.addEventListener("change", () => { syncStackOptions(); drawAll(); });
      if (stack) stack.addEventListener("change", drawAll);
      if (view) view.addEventListener("change", drawAll);
    }

    /* Swap the server-rendered sections for fresh ones; the markup comes from our own
       templates (escaped by Jinja), parsed inertly with DOMParser — no data is put into HTML here. */
    async function refreshSections() {
      const r = await fetch(location.pathname + location.search, { credentials: "same-origin" });
      if (r.redirected || r.status === 401) { loginRedirect(); return; }
      if (!r.ok) return;
      const doc = new DOMParser().parseFromString(await r.text(), "text/html");
      for (const section of $$("[data-live-section]")) {
        const fresh = doc.getElementById(section.id);
        if (fresh) section.replaceWith(document.importNode(fresh, true));
      }
      const freshGroups = doc.getElementById("groups-data");
      if (freshGroups && freshGroups.textContent !== $("#groups-data").textContent) {
        const sel = selection();
        $("#groups-data").textContent = freshGroups.textContent;
        groups = JSON.parse(freshGroups.textContent);
        const freshForm = doc.querySelector("[data-selectors]");
        const form = $("[data-selectors]");
        if (freshForm && form) {
          form.replaceWith(document.importNode(freshForm, true));
          if (sel.determinism) $("#sel-level").value = sel.determinism;
          if (sel.stack) $("#sel-stack").value = sel.stack;
          if (sel.view && $("#sel-view")) $("#sel-view").value = sel.view;
          bindSelectors();
        }
      }
      syncStackOptions();
    }

    async function poll() {
      let state = null;
      try {
        state = await getJSON(`/dashboard/data/studies/${studyId}/state`);
        if (state.version !== main.dataset.version) {
          main.dataset.version = state.version;
          await refreshSections();
          await drawAll();
          main.dataset.updates = String(Number(main.dataset.updates || "0") + 1);
        }
      } catch (err) {
        console.warn("live update:", err);
      }
      const note = $("[data-live-note]");
      if (state && !state.live) {
        main.dataset.live = "false";
        if (note) note.textContent = `Study ${state.status}`;
        return;
      }
      setTimeout(poll, state && state.status === "open" ? 10000 : 2000);
    }

    bindSelectors();
    syncStackOptions();
    drawAll();
    window.addEventListener("resize", () => slots.forEach((s) => s.resize()));
    if (main.dataset.live === "true") setTimeout(poll, 2000);
  }

  /* ------------------------------------------------------------------ run page */

  // A run may log hundreds of keys: each chart is fetched only when its figure comes near the
  // viewport, with at most RUN_CHARTS_IN_FLIGHT requests at a time.
  const RUN_CHARTS_IN_FLIGHT = 4;

  function initRun(main) {
    const runId = main.dataset.runId;
    const queue = [];
    let inFlight = 0;

    function load(figure) {
      const slot = new ChartSlot(figure);
      const key = figure.dataset.runMetric;
      figure.dataset.requested = "true";
      return getJSON(`/dashboard/data/runs/${runId}/chart?${new URLSearchParams({ key })}`).then((d) => {
        const data = [d.x, drawable(d.y)];
        const opts = {
          width: plotWidth(slot.plotEl), height: 220, legend: { show: true, live: true },
          series: [{ label: "step" }, lineSeries(unitLabel(key), COLORS.mean, 1.5, { value: valueFmt })],
          scales: { x: { time: false }, y: (() => { const r = runRange([d.y], key, false); return r ? { range: () => r } : {}; })() },
          axes: [xAxis(), yAxis(unitLabel(key), false)],
          hooks: { draw: [markerHook({ first_divergent_step: null,
            lines: d.diverged_at === null ? [] : [{ diverged_at: d.diverged_at, diverged_value: null }] })] },
        };
        const summary = `${key}: ${d.total_steps} step(s), last value ${fmt(lastValue(d.y))}` +
          (d.downsampled ? `, ${d.points} points plotted (extremes kept)` : "") +
          (d.diverged_at !== null ? `; became non-finite at step ${d.diverged_at}` : "") + ".";
        slot.show({ opts, data, lineCount: 1 }, summary, d.downsampled ? `${d.points} of ${d.total_steps} points` : "");
      }).catch((err) => slot.message(`Could not load the chart: ${err.message}`));
    }

    function pump() {
      while (inFlight < RUN_CHARTS_IN_FLIGHT && queue.length) {
        inFlight += 1;
        load(queue.shift()).finally(() => { inFlight -= 1; pump(); });
      }
    }

    const figures = $$("figure[data-run-metric]");
    for (const figure of figures) {
      $("[data-summary]", figure).textContent = "The chart loads when scrolled into view.";
    }
    const observer = new IntersectionObserver((entries) => {
      for (const entry of entries) {
        if (!entry.isIntersecting) continue;
        observer.unobserve(entry.target);
        queue.push(entry.target);
      }
      pump();
    }, { rootMargin: "200px 0px" });
    figures.forEach((f) => observer.observe(f));
  }

  /* ------------------------------------------------------------------ studies list */

  async function fillBadges() {
    const rows = $$("tr[data-badges-pending]");
    if (!rows.length) return;
    const ids = rows.map((r) => r.dataset.studyId).join(",");
    try {
      const got = await getJSON(`/dashboard/data/badges?ids=${ids}`);
      for (const row of rows) {
        const badges = got.badges[row.dataset.studyId];
        for (const cell of $$("td.badge-cell", row)) {
          const span = document.createElement("span");
          const b = badges && badges.find((x) => x.level === cell.dataset.level);
          if (b) {
            span.className = `verdict tone-${b.tone}`;
            span.title = b.hint || `worst of ${b.count} verdict(s)`;
            span.textContent = b.verdict.replace(/_/g, " ");
          } else {
            span.className = "muted small";
            span.textContent = "after the runs";
          }
          cell.replaceChildren(span);
        }
        row.removeAttribute("data-badges-pending");
      }
    } catch (err) {
      console.warn("badges:", err);
    }
  }

  window.steady = { tickLabels: tickValues };  // for the browser tests and the console

  document.addEventListener("DOMContentLoaded", () => {
    // widths come as data attributes: the Content-Security-Policy allows no inline style
    $$("[data-width]").forEach((el) => { el.style.width = Number(el.dataset.width) + "%"; });
    $$("form[data-selectors]").forEach((f) => f.addEventListener("submit", (e) => e.preventDefault()));
    const main = $("main");
    if (main.dataset.page === "study") initStudy(main);
    else if (main.dataset.page === "run") initRun(main);
    if ($("[data-studies]")) fillBadges();
  });
})();
