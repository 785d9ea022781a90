"""A diffusers pipeline exported as one multi-graph bundle: which components it deploys as (``table``), the graphs
with Optimum's names (``graphs``), the plan (``plan``), the pipeline directory (``directory``), the end-to-end
check in diffusers' own loop (``end_to_end``), the runner (``runner``) and validate's re-derivation (``check``);
``insert_teacache``'s cache: what it asks (``cache_spec``), the denoiser's graph variants (``cache_graphs``), the
runtime (``cached_denoiser``) and its measure at export (``cache_measure``)."""
