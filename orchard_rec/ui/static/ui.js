/* orchard-rec viewer: plain JavaScript, no build step.
 * Sessions page: live refresh of the rows (polling /api/stats), selects submit at once.
 * Session page: progressive token rendering (every token element ends up in the DOM), hover
 * details, heat map, call details (chat / raw JSON) fetched from /api or taken from the
 * embedded data in a standalone file, live "new calls" notice. */
(function () {
  "use strict";
  var body = document.body;
  var base = body.dataset.base || "";
  var standalone = body.dataset.standalone === "1";
  var pollMs = +body.dataset.poll || 2000;

  function esc(s) {
    return String(s).replace(/[&<>"]/g, function (c) {
      return c === "&" ? "&amp;" : c === "<" ? "&lt;" : c === ">" ? "&gt;" : "&quot;";
    });
  }

  function getJSON(url) {
    return fetch(url, { credentials: "same-origin" }).then(function (r) {
      if (!r.ok) throw new Error(url + ": " + r.status);
      return r.json();
    });
  }

  function poll(url, ms, onChange) {
    var last = null;
    var live = document.getElementById("live");
    function tick() {
      getJSON(url).then(function (s) {
        var key = JSON.stringify(s);
        if (last !== null && key !== last) onChange(s);
        last = key;
        if (live) live.classList.remove("off");
      }).catch(function () {
        if (live) live.classList.add("off");
      }).then(function () { setTimeout(tick, ms); });
    }
    tick();
  }

  /* ---------------------------------------------------------------- sessions page */
  function sessionsPage() {
    var form = document.getElementById("filters");
    form.querySelectorAll("select").forEach(function (s) {
      s.addEventListener("change", function () { form.submit(); });
    });
    form.addEventListener("submit", function () {
      form.querySelectorAll("input, select").forEach(function (el) {
        if (!el.value) el.disabled = true; /* keep the URL short */
      });
    });
    poll(base + "/api/stats", pollMs, function () {
      var q = location.search ? location.search + "&" : "?";
      Promise.all([
        fetch(location.pathname + q + "fragment=rows", { credentials: "same-origin" }).then(function (r) { return r.text(); }),
        getJSON(base + "/api/sessions" + (location.search || "")),
      ]).then(function (res) {
        document.getElementById("rows").innerHTML = res[0];
        var total = document.getElementById("total");
        total.dataset.total = res[1].total;
        total.innerHTML = "<b>" + res[1].total.toLocaleString("en-US") + "</b> session" + (res[1].total === 1 ? "" : "s");
        document.querySelectorAll(".pageno").forEach(function (p) {
          p.innerHTML = "page <b>" + res[1].page + "</b> of " + res[1].pages.toLocaleString("en-US");
        });
        var live = document.getElementById("live");
        if (live) { live.classList.add("flash"); setTimeout(function () { live.classList.remove("flash"); }, 800); }
      });
    });
  }

  /* ---------------------------------------------------------------- raw JSON */
  function pretty(v, ind) {
    ind = ind || "";
    if (v === null || typeof v !== "object") return esc(JSON.stringify(v));
    var inner = ind + "  ";
    if (Array.isArray(v)) {
      if (!v.length) return "[]";
      if (v.every(function (x) { return typeof x === "number"; })) {
        return '<span class="nums">[' + v.join(", ") + "]</span>";
      }
      return "[\n" + v.map(function (x) { return inner + pretty(x, inner); }).join(",\n") + "\n" + ind + "]";
    }
    var keys = Object.keys(v);
    if (!keys.length) return "{}";
    return "{\n" + keys.map(function (k) {
      return inner + '<span class="k">' + esc(JSON.stringify(k)) + "</span>: " + pretty(v[k], inner);
    }).join(",\n") + "\n" + ind + "}";
  }

  /* ---------------------------------------------------------------- chat */
  function renderChat(turns) {
    if (!turns || !turns.length) return '<p class="muted">No conversation in this call.</p>';
    return '<div class="chat">' + turns.map(function (t) {
      var blocks = (t.blocks || []).map(function (b) {
        if (b.kind === "reasoning") return '<details class="reasoning" open><summary>reasoning</summary><div class="txt">' + esc(b.text || "") + "</div></details>";
        if (b.kind === "tool_call") return '<div class="toolcall"><div class="tc-head">→ tool call <b>' + esc(b.name || "?") + "</b>" + (b.id ? ' <span class="sub">' + esc(b.id) + "</span>" : "") + '</div><pre>' + esc(b.text || "") + "</pre></div>";
        if (b.kind === "tool_result") return '<div class="toolres"><div class="tc-head">← tool result' + (b.id ? ' <span class="sub">' + esc(b.id) + "</span>" : "") + '</div><pre>' + esc(b.text || "") + "</pre></div>";
        if (b.kind === "image") return b.url ? '<a class="thumb" href="' + esc(b.url) + '" target="_blank" rel="noopener"><img src="' + esc(b.url) + '" alt="image" loading="lazy"></a>' : '<pre>' + esc(b.text || "") + "</pre>";
        return '<div class="txt">' + esc(b.text || "") + "</div>";
      }).join("");
      return '<div class="msg role-' + esc(t.role) + (t.answer ? " answer" : "") + '"><div class="role">' + esc(t.role) + (t.answer ? " · answer" : "") + "</div>" + blocks + "</div>";
    }).join("") + "</div>";
  }

  /* ---------------------------------------------------------------- session page */
  function sessionPage() {
    var el = document.getElementById("page-data");
    var data = JSON.parse(el.textContent);
    var sid = body.dataset.session;
    var vocab = data.vocab || {};
    var details = data.call_details || {};
    var tip = document.getElementById("tip");

    function callDetail(seq) {
      if (details[seq]) return Promise.resolve(details[seq]);
      return getJSON(base + "/api/sessions/" + encodeURIComponent(sid) + "/calls/" + seq).then(function (d) {
        details[seq] = d;
        return d;
      });
    }

    function showTab(call, tab) {
      var seq = call.dataset.callSeq;
      var out = call.querySelector(".tab-body");
      call.querySelectorAll(".tabs button").forEach(function (b) { b.classList.toggle("on", b.dataset.tab === tab); });
      callDetail(seq).then(function (d) {
        if (tab === "chat") out.innerHTML = renderChat(d.chat);
        else if (tab === "meta") out.innerHTML = '<pre class="json">' + pretty({ call_id: d.call_id, method: d.method, path: d.path, headers: d.headers, usage: d.usage, metadata: d.metadata, error: d.error }) + "</pre>";
        else out.innerHTML = d[tab] == null ? '<p class="muted">none recorded</p>' : '<pre class="json">' + pretty(d[tab]) + "</pre>";
      }).catch(function (e) { out.textContent = String(e); });
    }

    document.querySelectorAll(".call").forEach(function (call) {
      var head = call.querySelector(".call-head");
      var bodyEl = call.querySelector(".call-body");
      head.addEventListener("click", function () {
        var open = bodyEl.hidden;
        bodyEl.hidden = !open;
        head.setAttribute("aria-expanded", String(open));
        call.classList.toggle("open", open);
        if (open && !call.dataset.loaded) { call.dataset.loaded = "1"; showTab(call, "chat"); }
      });
      call.querySelectorAll(".tabs button").forEach(function (b) {
        b.addEventListener("click", function () { showTab(call, b.dataset.tab); });
      });
    });

    var heat = document.getElementById("heat");
    if (heat) heat.addEventListener("change", function () { body.classList.toggle("heat", heat.checked); });

    function bucket(lp) {
      return lp > -0.1 ? 0 : lp > -0.5 ? 1 : lp > -1 ? 2 : lp > -2.5 ? 3 : 4;
    }
    var SPECIAL = /^<[|\/]?[^<>\s]{1,24}[|]?>$/;
    /* Policy versions (asynchronous RL): a band over the generated tokens, one colour per
       version in order of appearance (6 colours, then again), "u" for unknown. */
    function versionBand(s, v) {
      if (v === "unknown") return "u";
      if (!s.vOrder) s.vOrder = {};
      if (!(v in s.vOrder)) s.vOrder[v] = Object.keys(s.vOrder).length % 6;
      return s.vOrder[v];
    }
    function tokenHTML(s, k) {
      var id = s.ids[k];
      var text = vocab[id];
      var kind = s.kind[k];
      var cls = "t k" + kind + " m" + s.mask[k];
      if (kind === 2 && s.lp[k] != null) cls += " h" + bucket(s.lp[k]);
      if (s.v && s.v[k] != null) cls += " pv" + versionBand(s, s.v[k]);
      var shown;
      if (text === undefined) { cls += " raw"; shown = "\u27e8" + id + "\u27e9"; }
      else {
        shown = text;
        if (SPECIAL.test(text)) cls += " sp";
        if (text.indexOf("\n") >= 0) cls += " nl";
        if (text === "") { cls += " raw"; shown = "\u2205"; }
      }
      return '<span class="' + cls + '" data-token-id="' + id + '" data-mask="' + s.mask[k] + '" data-p="' + k + '">' + esc(shown) + "</span>";
    }

    /* Progressive rendering: chunks within a frame budget, sample after sample, until every
       token element exists. body[data-tokens-ready] says when. */
    var boxes = Array.prototype.slice.call(document.querySelectorAll(".tokens[data-tokens-for]"));
    var jobs = boxes.map(function (box) { return { box: box, s: data.samples[+box.dataset.tokensFor], k: 0 }; });
    jobs.forEach(function (j) { j.box.innerHTML = ""; });
    var ji = 0;
    var firstChunk = false;
    function mark(name) { if (window.performance && performance.mark) performance.mark(name); }
    function step() {
      var t0 = performance.now();
      while (ji < jobs.length && performance.now() - t0 < 14) {
        var j = jobs[ji];
        var n = j.s.ids.length;
        /* one block per chunk (so the browser lays out only the new block, and skips off-screen
           ones: content-visibility), cut after a newline token where one is near */
        var end = Math.min(n, j.k + 3000);
        for (var e = Math.min(n, j.k + 2000); e < Math.min(n, j.k + 4000); e++) {
          var tx = vocab[j.s.ids[e - 1]];
          if (tx !== undefined && tx.indexOf("\n") >= 0) { end = e; break; }
        }
        var html = [];
        for (var k = j.k; k < end; k++) html.push(tokenHTML(j.s, k));
        j.box.insertAdjacentHTML("beforeend", '<div class="chunk">' + html.join("") + "</div>");
        j.k = end;
        if (end >= n) { j.box.dataset.rendered = "1"; ji++; }
      }
      if (!firstChunk) { firstChunk = true; mark("orchard-first-tokens"); }
      if (ji < jobs.length) requestAnimationFrame(step);
      else { body.dataset.tokensReady = "1"; mark("orchard-tokens-ready"); }
    }
    if (jobs.length) step(); else body.dataset.tokensReady = "1";

    /* Hover details for any token of any sample (one listener per box). */
    function sampleOf(box) { return data.samples[+box.dataset.tokensFor]; }
    boxes.forEach(function (box) {
      box.addEventListener("mouseover", function (ev) {
        var t = ev.target.closest("[data-token-id]");
        if (!t) return;
        var s = sampleOf(box);
        var k = +t.dataset.p;
        var kinds = ["prompt", "observation", "generated"];
        var lp = s.lp[k];
        var w = s.w ? s.w[k] : null;
        tip.innerHTML = "<b>#" + k + "</b> id <b>" + s.ids[k] + "</b><br>" + kinds[s.kind[k]] + (s.mask[k] ? " · <span class=good>trained</span>" : " · not trained") +
          (lp != null ? "<br>logprob " + lp.toFixed(4) + " (p " + Math.exp(lp).toFixed(3) + ")" : "") +
          (w != null ? "<br>credit weight " + (+w).toFixed(3) : "") +
          (s.v && s.v[k] != null ? "<br>policy version <b>" + esc(s.v[k]) + "</b>" : "") +
          (vocab[s.ids[k]] !== undefined ? "<br><code>" + esc(JSON.stringify(vocab[s.ids[k]])) + "</code>" : "");
        var r = t.getBoundingClientRect();
        tip.hidden = false;
        tip.style.left = Math.min(window.innerWidth - 260, Math.max(4, r.left)) + "px";
        tip.style.top = (r.bottom + 6) + "px";
      });
      box.addEventListener("mouseleave", function () { tip.hidden = true; });
    });

    if (!standalone) {
      var calls = +body.dataset.calls;
      var hasOutcome = body.dataset.outcome === "1";
      poll(base + "/api/sessions/" + encodeURIComponent(sid) + "/stats", pollMs, function (s) {
        if (s.calls !== calls || s.outcome !== hasOutcome) document.getElementById("stale").hidden = false;
      });
    }
  }

  var page = body.dataset.page;
  if (page === "sessions") sessionsPage();
  else if (page === "session") sessionPage();
})();
