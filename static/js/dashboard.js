// Jump to an event by its anchor (#event-<seq>): open every collapsed fold, span and turn
// around it first, so a citation, a search hit or a dropped-evidence link lands on text
// that is actually visible.
(function () {
  function reveal(id) {
    var target = document.getElementById(id);
    if (!target) return;
    for (var node = target; node; node = node.parentElement) {
      if (node.tagName === "DETAILS") node.open = true;
    }
    var own = target.querySelector(":scope > details");
    if (own) own.open = true;
    target.classList.add("flash");
    target.scrollIntoView({ block: "center" });
    setTimeout(function () { target.classList.remove("flash"); }, 1600);
  }
  function fromHash() {
    if (location.hash.length > 1) reveal(decodeURIComponent(location.hash.slice(1)));
  }
  document.addEventListener("click", function (event) {
    var link = event.target.closest && event.target.closest('a[href^="#event-"]');
    if (!link) return;
    event.preventDefault();
    var id = link.getAttribute("href").slice(1);
    history.replaceState(null, "", "#" + id);
    reveal(id);
  });
  // A run's "Before / after" swaps its panel in by htmx: bring the panel into view (it sits
  // below the history, often off screen).
  document.addEventListener("htmx:afterSwap", function (event) {
    var panel = event.target && event.target.id === "run-detail" ? event.target : document.getElementById("run-detail");
    if (panel && event.detail && event.detail.requestConfig && /\/compactions\//.test(event.detail.requestConfig.path || "")) {
      panel.scrollIntoView({ block: "start" });
    }
  });
  // A staff form (Compact now, Revert) may be replaced by the run's own websocket push before
  // its answer arrives, and so may the #notice its answer goes to. htmx looks for the
  // answer's out-of-band parts (#controls, #history, …) from the element that asked: once
  // that is out of the page, none would be found. Such an answer is swapped from the
  // document instead, so every part finds its place.
  function fromTheDocument(event) {
    var detail = event.detail || {};
    var asked = detail.requestConfig && detail.requestConfig.elt;
    var target = detail.target;
    if (!detail.shouldSwap || !asked || !target || !target.id) return;
    if (asked.isConnected && target.isConnected) return;
    detail.shouldSwap = false;
    window.htmx.swap("#" + CSS.escape(target.id), detail.serverResponse, { swapStyle: "outerHTML" });
  }
  // An event on an element no longer in the page does not reach the document: the answer's
  // target (#notice) gets the listener too, while it is in the page (htmx:confirm comes
  // first of all, before hx-confirm's dialog, during which a push may already land).
  document.addEventListener("htmx:beforeSwap", fromTheDocument);
  document.addEventListener("htmx:confirm", function (event) {
    var asked = event.target;
    var notice = document.getElementById("notice");
    if (notice && asked && asked.closest && asked.closest("#controls, #history")) {
      notice.removeEventListener("htmx:beforeSwap", fromTheDocument);
      notice.addEventListener("htmx:beforeSwap", fromTheDocument);
    }
  });
  window.addEventListener("hashchange", fromHash);
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", fromHash);
  else fromHash();
  window.ledgerReveal = reveal;
})();
