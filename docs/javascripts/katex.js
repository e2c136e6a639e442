// Typesets the formulas pymdownx.arithmatex marks (generic output: \( \) inline, \[ \] displayed) with KaTeX,
// on every page Material shows (document$ emits on each one, instant navigation included).
document$.subscribe(() => {
  for (const formula of document.querySelectorAll(".arithmatex")) {
    renderMathInElement(formula, {
      delimiters: [
        { left: "\\(", right: "\\)", display: false },
        { left: "\\[", right: "\\]", display: true },
      ],
      throwOnError: false,
    });
  }
});
