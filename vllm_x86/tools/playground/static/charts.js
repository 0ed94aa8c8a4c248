// Small line charts in SVG for the Server view, drawn here instead of with a chart
// library: the page loads nothing from outside the playground and has no build step,
// and four sparkline-sized charts of the last samples need only a polyline and a label.

const SVG_NS = "http://www.w3.org/2000/svg";
const HEIGHT = 120; // the CSS height; the width is the element's own, so text is not stretched
const PAD = { left: 34, right: 8, top: 10, bottom: 18 };

function el(name, attrs = {}, text = null) {
  const node = document.createElementNS(SVG_NS, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== null) node.textContent = text;
  return node;
}

function niceMax(value) {
  if (!(value > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 4, 5, 10]) {
    if (value <= step * power) return step * power;
  }
  return 10 * power;
}

// values: numbers or null (a gap, when the sample was missing). options: {max (fixed top
// of the scale, else from the data), min_top (the lowest top the scale may have),
// format (value -> label), window_s (seconds shown)}
export function drawChart(svg, values, options = {}) {
  const format = options.format || ((v) => String(Math.round(v * 10) / 10));
  const WIDTH = Math.max(160, Math.round(svg.getBoundingClientRect().width) || 320);
  svg.setAttribute("viewBox", `0 0 ${WIDTH} ${HEIGHT}`);
  svg.replaceChildren();
  const known = values.filter((v) => v !== null && Number.isFinite(v));
  const top = options.max ?? niceMax(Math.max(options.min_top || 0, ...known));
  const plotW = WIDTH - PAD.left - PAD.right;
  const plotH = HEIGHT - PAD.top - PAD.bottom;
  const x = (i) => PAD.left + (values.length <= 1 ? plotW : (i / (values.length - 1)) * plotW);
  const y = (v) => PAD.top + plotH - (Math.min(v, top) / top) * plotH;

  for (const frac of [0, 0.5, 1]) {
    const gy = PAD.top + plotH - frac * plotH;
    svg.append(el("line", { x1: PAD.left, x2: WIDTH - PAD.right, y1: gy, y2: gy, class: "grid" }));
    svg.append(el("text", { x: PAD.left - 4, y: gy + 3, class: "axis", "text-anchor": "end" }, format(top * frac)));
  }
  if (options.window_s) {
    svg.append(el("text", { x: PAD.left, y: HEIGHT - 4, class: "axis" }, `-${options.window_s} s`));
    svg.append(el("text", { x: WIDTH - PAD.right, y: HEIGHT - 4, class: "axis", "text-anchor": "end" }, "now"));
  }
  if (!known.length) {
    svg.append(el("text", { x: PAD.left + plotW / 2, y: PAD.top + plotH / 2, class: "empty", "text-anchor": "middle" }, "no data yet"));
    return;
  }
  // one polyline per run of known samples
  let run = [];
  const runs = [];
  values.forEach((v, i) => {
    if (v === null || !Number.isFinite(v)) {
      if (run.length) runs.push(run);
      run = [];
    } else {
      run.push([x(i), y(v)]);
    }
  });
  if (run.length) runs.push(run);
  for (const points of runs) {
    const base = PAD.top + plotH;
    const area = [[points[0][0], base], ...points, [points[points.length - 1][0], base]];
    svg.append(el("polygon", { points: area.map((p) => p.join(",")).join(" "), class: "area" }));
    svg.append(el("polyline", { points: points.map((p) => p.join(",")).join(" "), class: "line" }));
  }
}
