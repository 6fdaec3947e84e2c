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
  window.addEventListener("hashchange", fromHash);
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", fromHash);
  else fromHash();
  window.ledgerReveal = reveal;
})();
