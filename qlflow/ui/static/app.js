// qlflow dashboard: local times, relative hints, the time zone for the filters, the
// live refresh of a running Run's page (polls a fragment once a second), and the live
// tail of a running Attempt's log (polls for the lines after the last one it has).
(function () {
  "use strict";

  function pad(n, width) {
    return String(n).padStart(width || 2, "0");
  }

  function localText(ms) {
    var d = new Date(ms);
    return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " +
      pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds()) + "." +
      pad(d.getMilliseconds(), 3);
  }

  function duration(ms) {
    if (ms < 1000) return ms + "ms";
    if (ms < 60000) return (ms / 1000).toFixed(1) + "s";
    var s = Math.floor(ms / 1000), m = Math.floor(s / 60);
    if (m < 60) return m + "m" + pad(s % 60) + "s";
    var h = Math.floor(m / 60);
    if (h < 48) return h + "h" + pad(m % 60) + "m";
    return Math.floor(h / 24) + "d" + pad(h % 24) + "h";
  }

  function relative(ms) {
    var delta = Date.now() - ms;
    if (Math.abs(delta) < 1000) return "just now";
    return delta > 0 ? duration(delta) + " ago" : "in " + duration(-delta);
  }

  function decorate(root) {
    root.querySelectorAll("time.local[data-ms]").forEach(function (el) {
      var ms = Number(el.dataset.ms);
      el.textContent = localText(ms);
      el.title = new Date(ms).toString();
    });
    refreshRelative(root);
  }

  function refreshRelative(root) {
    root.querySelectorAll(".rel[data-ms]").forEach(function (el) {
      el.textContent = relative(Number(el.dataset.ms));
    });
  }

  function live(el) {
    var busy = false;
    function tick() {
      if (busy || el.dataset.live !== "1") return;
      busy = true;
      var base = el.dataset.liveUrl;
      var url = base + (base.indexOf("?") < 0 ? "?" : "&") + "stamp=" +
        encodeURIComponent(el.dataset.stamp || "");
      fetch(url, { credentials: "same-origin", headers: { Accept: "text/html" }, cache: "no-store" })
        .then(function (response) {
          if (response.status !== 200) return null;
          el.dataset.stamp = response.headers.get("X-Qlflow-Stamp") || "";
          el.dataset.live = response.headers.get("X-Qlflow-Live") || "0";
          return response.text();
        })
        .then(function (html) {
          if (html === null) return;
          el.innerHTML = html; // rendered and escaped by the server
          decorate(el);
          el.querySelectorAll("[data-tail-url]").forEach(tail); // logs of a new body
          el.dispatchEvent(new CustomEvent("qlflow:updated", { bubbles: true }));
        })
        .catch(function () { /* the next tick tries again */ })
        .finally(function () { busy = false; });
    }
    setInterval(tick, 1000);
  }

  function tail(el) {
    var busy = false;
    var body = el.querySelector("tbody");
    var timer = setInterval(tick, 1000);
    function tick() {
      if (busy) return;
      // stops when its Attempt ended, or when a new body of the page replaced it
      if (el.dataset.live !== "1" || !el.isConnected) { clearInterval(timer); return; }
      busy = true;
      var last = body.lastElementChild;
      var url = el.dataset.tailUrl + "?after=" + encodeURIComponent(el.dataset.after || "0");
      if (last && last.dataset.end === "0") url += "&open=" + encodeURIComponent(last.dataset.stream);
      fetch(url, { credentials: "same-origin", headers: { Accept: "text/html" }, cache: "no-store" })
        .then(function (response) {
          if (response.status !== 200) return null;
          el.dataset.after = response.headers.get("X-Qlflow-After") || el.dataset.after;
          el.dataset.live = response.headers.get("X-Qlflow-Live") || "0";
          var status = response.headers.get("X-Qlflow-Status");
          var badge = el.querySelector("[data-role=status]");
          if (status && badge) { badge.textContent = status; badge.className = "badge st-" + status; }
          if (el.dataset.live !== "1") el.querySelectorAll(".tailing").forEach(function (t) { t.hidden = true; });
          return response.text();
        })
        .then(function (html) {
          if (!html || !html.trim()) return;
          var rows = document.createElement("tbody");
          rows.innerHTML = html; // rendered and escaped by the server
          var first = rows.firstElementChild;
          last = body.lastElementChild;
          if (first && first.dataset.continues === "1" && last && last.dataset.end === "0") {
            last.querySelector(".x").textContent += first.querySelector(".x").textContent;
            last.dataset.end = first.dataset.end;
            last.dataset.seq = first.dataset.seq;
            first.remove();
          }
          decorate(rows);
          var atBottom = window.innerHeight + window.scrollY >= document.body.scrollHeight - 40;
          while (rows.firstChild) body.appendChild(rows.firstChild);
          el.querySelectorAll(".log-empty").forEach(function (p) { p.hidden = true; });
          if (atBottom) window.scrollTo(0, document.body.scrollHeight);
          el.dispatchEvent(new CustomEvent("qlflow:log", { bubbles: true }));
        })
        .catch(function () { /* the next tick tries again */ })
        .finally(function () { busy = false; });
    }
  }

  document.addEventListener("DOMContentLoaded", function () {
    decorate(document);
    setInterval(function () { refreshRelative(document); }, 5000);
    document.querySelectorAll("input[data-tz]").forEach(function (input) {
      input.value = String(new Date().getTimezoneOffset());
    });
    document.querySelectorAll("[data-live-url]").forEach(live);
    document.querySelectorAll("[data-tail-url]").forEach(tail);
  });
})();
